// Templates of the local backend (templates.hpp): a directory copied into a layer, refused where
// a layer cannot hold what it has, and a sandbox whose root is an overlay of the layer, mounted
// idmapped, with a tmpfs upper of its own. Real namespaces, a real static busybox root the test
// makes, every check of the host made from the host.
#include "support/demo_wheel.hpp"
#include "support/moat_cli.hpp"
#include "support/template_fixture.hpp"

#include <moat/templates.hpp>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

using moat::test::busybox;
using moat::test::make_busybox_root;
using moat::test::scratch_dir;
using moat::test::template_fixture;
using moat::test::write_text;

namespace {

// The busybox root plus the host's python3 (its real file, python3.N, with /usr/bin/python3 a
// link to it), the libraries it and its _ssl and _hashlib modules load, its standard library
// (without tests, IDLE, Tk, lib2to3, ensurepip and caches) and Debian's pip: some 40 MB. The
// interpreter's real path, or "" when the host lacks one of these.
std::string make_python_root(const fs::path& at) {
    make_busybox_root(at);
    std::error_code ec;
    const auto python = fs::canonical("/usr/bin/python3", ec);
    if (ec || !python.filename().string().starts_with("python3.") ||
        !fs::exists("/usr/lib/python3/dist-packages/pip"))
        return {};
    const std::string script =
        "set -e; R='" + at.string() + "'; PY='" + python.string() +
        "'; V=$(basename $PY)\n"
        "mkdir -p $R/usr/bin $R/usr/lib/python3/dist-packages\n"
        "cp $PY $R/usr/bin/ && ln -s $V $R/usr/bin/python3\n"
        "for lib in $(ldd $PY /usr/lib/$V/lib-dynload/_ssl.*.so "
        "/usr/lib/$V/lib-dynload/_hashlib.*.so | grep -o '/[^ :]*'); do\n"
        "  mkdir -p $R$(dirname $lib) && cp -L $lib $R$lib\n"
        "done\n"
        "tar -C /usr/lib -cf - --exclude=__pycache__ --exclude=$V/test --exclude=$V/idlelib "
        "--exclude=$V/tkinter --exclude=$V/lib2to3 --exclude=$V/ensurepip --exclude='config-*' "
        "--exclude=dist-packages $V | tar -C $R/usr/lib -xf -\n"
        "tar -C /usr/lib/python3/dist-packages -cf - --exclude=__pycache__ pip | "
        "tar -C $R/usr/lib/python3/dist-packages -xf -\n";
    const fs::path file = at.parent_path() / "make-python-root.sh";
    write_text(file, script);
    if (std::system(("sh " + file.string()).c_str()) != 0) return {};
    return "/usr/bin/" + python.filename().string();
}

}  // namespace

TEST_CASE_FIXTURE(template_fixture,
                  "a template from a directory is the sandbox's root, writable by copy-up, and "
                  "its layer stays as built") {
    MOAT_REQUIRE_NAMESPACES();
    const auto source = make_busybox_root(scratch.path / "src");
    const auto made = build("bb", source);
    CHECK(made.digest.starts_with("sha256:"));
    CHECK(made.size_bytes >= fs::file_size(busybox));
    const auto box = create_from("bb");
    CHECK(box.template_name == "bb");
    CHECK(box.template_digest == made.digest);

    // Not the host's root: no /usr/bin, the template's own files, moat's /etc/passwd over them.
    CHECK(sh(box.id, "ls /usr/bin").exit_code != 0);
    CHECK(sh(box.id, "cat /etc/motd").out.text() == "from the template\n");
    const auto passwd = sh(box.id, "cat /etc/passwd").out.text();
    CHECK(passwd.find("user:x:1000:1000:") != std::string::npos);
    CHECK(sh(box.id, "id -u").out.text() == "1000\n");
    // The sandbox user writes where the template lets it (copy-up), as itself, and nowhere else.
    const auto wrote = sh(box.id, "echo mine > /data/x && stat -c '%U %a' /data/x");
    CHECK_MESSAGE(wrote.exit_code == 0, wrote.err.text());
    CHECK(wrote.out.text() == "user 644\n");
    CHECK(sh(box.id, "touch /bin/new").exit_code != 0);
    CHECK(sh(box.id, "echo x > /etc/motd").exit_code != 0);
    CHECK(sh(box.id, "stat -c '%U %G %a' / /bin /bin/busybox").out.text() ==
          "root root 755\nroot root 755\nroot root 755\n");
    CHECK(sh(box.id, "touch /workspace/a /tmp/b").exit_code == 0);
    // The sandbox's root changes its root by copy-up: appends to a root-owned file, makes a
    // directory, changes a mode; uid 1000 still may not.
    auto as_root = moat::test::shell(
        "echo more >> /usr/lib/data && mkdir /usr/new && chmod 600 /usr/lib/data && "
        "stat -c '%U %a' /usr/lib/data /usr/new && cat /usr/lib/data");
    as_root.as_root = true;
    auto changed = run(local->async_exec(box.id, as_root));
    REQUIRE(changed);
    CHECK_MESSAGE(changed->exit_code == 0, changed->err.text());
    CHECK(changed->out.text() == "root 600\nroot 755\ntemplate data\nmore\n");
    CHECK(sh(box.id, "echo x >> /usr/lib/data").exit_code != 0);
    CHECK(sh(box.id, "touch /usr/new/x").exit_code != 0);
    destroy(box.id);

    // Nothing reached the layer or the source tree, and the layer's digest is still its name.
    CHECK_FALSE(fs::exists(store.layer_root(made.digest) + "/data/x"));
    CHECK_FALSE(fs::exists(store.layer_root(made.digest) + "/usr/new"));
    std::ifstream data(store.layer_root(made.digest) + "/usr/lib/data");
    CHECK(std::string(std::istreambuf_iterator<char>(data), {}) == "template data\n");
    CHECK_FALSE(fs::exists(source / "data/x"));
    auto again = store.digest_of_layer(made.digest);
    REQUIRE(again);
    CHECK(*again == made.digest);
}

TEST_CASE_FIXTURE(template_fixture,
                  "links in a template resolve against the sandbox's root, and two sandboxes of "
                  "one template share nothing they write") {
    MOAT_REQUIRE_NAMESPACES();
    const auto source = make_busybox_root(scratch.path / "src");
    fs::create_symlink("/", source / "escape");
    fs::create_symlink("../../../../../../etc", source / "data/up");
    build("links", source);
    const auto a = create_from("links");
    // The second with moat serve's layout: its own user name and a home under /home.
    moat::sandbox_spec spec;
    spec.template_name = "links";
    spec.layout.user = "agent";
    spec.layout.home = "/home/agent";
    spec.layout.workdir = "/home/agent";
    spec.layout.artifacts_dir = "/home/agent/out";
    const auto b = create(spec);
    CHECK(sh(b.id, "id -un; pwd; touch ~/f && ls ~").out.text() == "agent\n/home/agent\nf\nout\n");
    CHECK(sh(a.id, "cat /escape/etc/motd").out.text() == "from the template\n");
    CHECK(sh(a.id, "cat /data/up/motd").out.text() == "from the template\n");
    CHECK(sh(a.id, "ls /escape/usr/bin").exit_code != 0);
    CHECK(sh(a.id, "echo a > /data/only-a").exit_code == 0);
    CHECK(sh(b.id, "cat /data/only-a").exit_code != 0);
    destroy(a.id);
    destroy(b.id);
}

TEST_CASE_FIXTURE(template_fixture,
                  "a sandbox's writes to its root are bounded by its upper, and sudo works in it") {
    MOAT_REQUIRE_NAMESPACES();
    build("small", make_busybox_root(scratch.path / "src"));
    moat::sandbox_spec spec;
    spec.template_name = "small";
    spec.limits.workspace_bytes = 8 << 20;
    spec.allow_sudo = true;
    const auto box = create(spec);
    // moat's own commands are there too: sudo (its shim in /opt/moat/bin) runs as root.
    const auto sudo = sh(box.id, "sudo id -u");
    CHECK_MESSAGE(sudo.exit_code == 0, sudo.err.text());
    CHECK(sudo.out.text() == "0\n");
    const auto filled = sh(box.id, "dd if=/dev/zero of=/data/big bs=1M count=64 2>&1");
    CHECK(filled.exit_code != 0);
    CHECK(filled.out.text().find("No space left") != std::string::npos);
    const auto size = sh(box.id, "stat -c %s /data/big").out.text();
    CHECK(std::stoull(size) <= (8u << 20));
    destroy(box.id);
}

TEST_CASE_FIXTURE(template_fixture,
                  "a build clears setuid bits and refuses what a layer cannot hold, leaving "
                  "nothing behind") {
    const auto source = make_busybox_root(scratch.path / "src");
    fs::permissions(source / "bin/busybox", fs::perms::set_uid | fs::perms::set_gid,
                    fs::perm_options::add);
    auto built = store.build_from_dir("suid", source.string());
    REQUIRE_MESSAGE(built, built.error().to_string());
    CHECK(built->cleared == std::vector<std::string>{"/bin/busybox: setuid bit cleared",
                                                     "/bin/busybox: setgid bit cleared"});
    struct stat st {};
    REQUIRE(::stat((store.layer_root(built->built.digest) + "/bin/busybox").c_str(), &st) == 0);
    CHECK((st.st_mode & 06000) == 0);
    CHECK((st.st_mode & 0777) == 0755);

    const auto refused = [this](const fs::path& root, const std::string& needle) {
        auto r = store.build_from_dir("refused", root.string());
        REQUIRE_FALSE(r);
        CHECK(r.error().code == moat::errc::invalid_argument);
        CHECK_MESSAGE(r.error().detail.find(needle) != std::string::npos, r.error().detail);
        CHECK_FALSE(store.find("refused"));
    };
    {
        const auto root = make_busybox_root(scratch.path / "device");
        REQUIRE(::mknod((root / "data/null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0);
        refused(root, "/data/null: a device node");
    }
    {
        const auto root = make_busybox_root(scratch.path / "foreign");
        write_text(root / "data/f", "x");
        REQUIRE(::chown((root / "data/f").c_str(), 70000, 0) == 0);
        refused(root, "/data/f: owned by 70000:0");
    }
    {
        const auto root = make_busybox_root(scratch.path / "etclink");
        fs::remove_all(root / "etc");
        fs::create_symlink("/etc", root / "etc");
        refused(root, "/etc: not a directory");
    }
    {
        const auto root = make_busybox_root(scratch.path / "noshell");
        fs::remove(root / "bin/sh");
        refused(root, "/bin/sh: missing");
    }
    for (const char* name : {"base", "", "Upper", "-x", "a/b", "..",
                             "a-name-that-is-much-longer-than-sixty-three-bytes-and-so-refused"}) {
        auto r = store.build_from_dir(name, source.string());
        CHECK_FALSE(r);
        if (!r) CHECK(r.error().code == moat::errc::invalid_argument);
    }
    auto missing = store.build_from_dir("missing", (scratch.path / "nowhere").string());
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == moat::errc::file_not_found);
    // Only the one good build left anything: one layer, no staging.
    CHECK(fs::is_empty(store.data_dir() + "/staging"));
    std::size_t layers = 0;
    for (const auto& entry : fs::directory_iterator(store.data_dir() + "/layers")) {
        (void)entry;
        ++layers;
    }
    CHECK(layers == 1);
}

TEST_CASE_FIXTURE(template_fixture,
                  "an unknown template is invalid_argument, a template in use is not removed, "
                  "and its layer goes with it once unused") {
    MOAT_REQUIRE_NAMESPACES();
    moat::sandbox_spec spec;
    spec.template_name = "nosuch";
    auto made = run(local->async_create(spec));
    REQUIRE_FALSE(made);
    CHECK(made.error().code == moat::errc::invalid_argument);
    CHECK(made.error().detail.find("template 'nosuch' does not exist") != std::string::npos);

    const auto info = build("used", make_busybox_root(scratch.path / "src"));
    // A rebuild of the same tree names the same layer.
    CHECK(build("same", scratch.path / "src").digest == info.digest);
    const auto box = create_from("used");
    auto refused = store.remove("used", {box.template_digest});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().detail.find("in use") != std::string::npos);
    // Without the caller knowing of it (a sandbox of another state directory, another process):
    // the layer's lock, which the sandbox's pid 1 holds, refuses the removal just the same.
    auto unknown = store.remove("used", {});
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().detail.find("in use") != std::string::npos);
    CHECK(store.find("used"));
    destroy(box.id);
    REQUIRE(store.remove("used", {}));
    CHECK_FALSE(store.find("used"));
    CHECK(fs::exists(store.layer_root(info.digest)));  // "same" still names it
    REQUIRE(store.remove("same", {}));
    CHECK_FALSE(fs::exists(store.layer_root(info.digest)));
    CHECK_FALSE(fs::exists(moat::template_store::lock_path_of(store.layer_root(info.digest))));
    auto listed = store.list();
    REQUIRE(listed);
    CHECK(listed->empty());
}

TEST_CASE_FIXTURE(template_fixture,
                  "a template with python3 gives each sandbox its own Python environment over "
                  "the template's interpreter, and one without python3 gets none") {
    MOAT_REQUIRE_NAMESPACES();
    const auto plain = build("plain", make_busybox_root(scratch.path / "plain"));
    CHECK(plain.python.empty());
    const auto bare = create_from("plain");
    CHECK(sh(bare.id, "test -e /opt/moat/python/bin/python3").exit_code != 0);
    CHECK(sh(bare.id, "echo fine").out.text() == "fine\n");
    destroy(bare.id);

    const std::string interpreter = make_python_root(scratch.path / "py");
    if (interpreter.empty()) {
        MESSAGE("SKIPPED the python template: the host lacks /usr/bin/python3.N or Debian's pip");
        return;
    }
    const auto made = build("py", scratch.path / "py");
    CHECK(made.python == interpreter);
    auto found = store.find("py");
    REQUIRE(found);
    CHECK(found->python == interpreter);  // kept in the record
    const auto listed =
        moat::test::moat_cli("MOAT_DATA_DIR=" + store.data_dir(), "template ls --json");
    CHECK(listed.output.find("\"python\":\"" + interpreter + "\"") != std::string::npos);
    const auto box = create_from("py");
    CHECK(sh(box.id, "ls /usr/bin/id").exit_code != 0);  // not the host's /usr
    CHECK(sh(box.id, "readlink /opt/moat/python/bin/python3").out.text() == interpreter + "\n");
    const auto prefix = sh(box.id, "python -c 'import sys; print(sys.prefix, sys.base_prefix)'");
    CHECK_MESSAGE(prefix.exit_code == 0, prefix.err.text());
    CHECK(prefix.out.text() == "/opt/moat/python /usr\n");
    const std::string wheel = std::string("/workspace/") + moat::test::demo_wheel_name;
    REQUIRE(sh(box.id, moat::test::demo_wheel_command("python3", wheel)).exit_code == 0);
    const auto installed = sh(box.id, "pip install " + wheel, std::chrono::seconds(120));
    CHECK_MESSAGE(installed.exit_code == 0, installed.out.text() << installed.err.text());
    CHECK(sh(box.id, "python3 -c 'import demo_pkg; print(demo_pkg.VALUE)'").out.text() == "42\n");
    CHECK(sh(box.id, "demo-tool").out.text() == "tool 42\n");
    destroy(box.id);
    // Nothing reached the layer.
    CHECK_FALSE(fs::exists(store.layer_root(made.digest) + "/opt/moat/python/bin/demo-tool"));
    auto again = store.digest_of_layer(made.digest);
    REQUIRE(again);
    CHECK(*again == made.digest);
}

TEST_CASE("moat template build, ls, verify and rm, and moat run --template, as a user runs them") {
    MOAT_REQUIRE_NAMESPACES();
    REQUIRE(::access(busybox, X_OK) == 0);
    scratch_dir scratch;
    const auto source = make_busybox_root(scratch.path / "src");
    fs::permissions(source / "bin/busybox", fs::perms::set_uid, fs::perm_options::add);
    const std::string env = "MOAT_DATA_DIR=" + (scratch.path / "data").string();
    const auto built = moat::test::moat_cli(env, "template build bb --from-dir " + source.string());
    CHECK(built.exit_code == 0);
    CHECK(built.output.find("cleared: /bin/busybox: setuid bit cleared\n") != std::string::npos);
    CHECK(built.output.find("built bb sha256:") != std::string::npos);
    const auto listed = moat::test::moat_cli(env, "template ls");
    CHECK(listed.exit_code == 0);
    CHECK(listed.output.starts_with("NAME "));
    CHECK(listed.output.find("\nbb ") != std::string::npos);
    const auto ran = moat::test::moat_cli(
        env, "run --template bb -- sh -c 'cat /etc/motd; ls /usr/bin 2>/dev/null'");
    // (stderr silenced: the CLI relays a command's stdout and stderr from separate pipes, so their
    // order in one stream is not the command's.)
    CHECK(ran.exit_code != 0);
    CHECK_MESSAGE(ran.output == "from the template\n", ran.output);
    CHECK(moat::test::moat_cli(env, "template verify bb").output.starts_with("ok bb sha256:"));
    const auto unknown = moat::test::moat_cli(env, "run --template nosuch -- true");
    CHECK(unknown.exit_code == 2);
    CHECK(unknown.output.find("template 'nosuch' does not exist") != std::string::npos);
    const auto bad = moat::test::moat_cli(env, "template build base --from-dir " + source.string());
    CHECK(bad.exit_code == 2);
    CHECK(moat::test::moat_cli(env, "template rm bb").exit_code == 0);
    CHECK(moat::test::moat_cli(env, "template ls --json").output == "[]\n");
}

TEST_CASE_FIXTURE(template_fixture,
                  "a build past the data directory's budget deletes unused layers first, then "
                  "fails naming the budget and leaves nothing") {
    const auto first_root = make_busybox_root(scratch.path / "first");
    const auto first = build("first", first_root);
    const std::uint64_t one_layer = store.data_bytes();
    REQUIRE(one_layer > 0);
    // An unused layer: no record names it any more.
    fs::remove(fs::path(store.data_dir()) / "templates/first.json");
    const auto differs = [this](const char* dir, const char* marker) {
        const auto root = make_busybox_root(scratch.path / dir);
        std::ofstream(root / "marker") << marker;
        return root;
    };
    // Room for about one and a half layers: the unused one goes, and the build fits.
    moat::template_store tight(store.data_dir(), one_layer + one_layer / 2);
    auto second = tight.build_from_dir("second", differs("second", "2").string());
    REQUIRE_MESSAGE(second, second.error().to_string());
    CHECK_FALSE(fs::exists(store.layer_root(first.digest)));
    CHECK(fs::exists(store.layer_root(second->built.digest)));
    // A third layer does not fit beside the second, which a template names: refused, typed.
    auto third = tight.build_from_dir("third", differs("third", "3").string());
    REQUIRE_FALSE(third);
    CHECK(third.error().code == moat::errc::limit_exceeded);
    CHECK(third.error().detail.find("budget") != std::string::npos);
    CHECK_FALSE(tight.find("third"));
    CHECK(tight.find("second"));
    CHECK(fs::is_empty(fs::path(store.data_dir()) / "staging"));
    // The same tree again needs no room: its layer exists.
    auto again = tight.build_from_dir("again", (scratch.path / "second").string());
    REQUIRE_MESSAGE(again, again.error().to_string());
    CHECK(again->built.digest == second->built.digest);
}
