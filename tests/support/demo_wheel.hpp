// A wheel the Python-environment tests build themselves (no index, no download): package
// demo_pkg 1.0 (distribution demo-pkg), whose module holds VALUE = 42 and a main() printing
// "tool 42", with a console script demo-tool running it. Written with python3's zipfile.
#pragma once

#include <string>

namespace moat::test {

// The wheel's file name (what an index lists and pip expects).
inline constexpr const char* demo_wheel_name = "demo_pkg-1.0-py3-none-any.whl";

// A shell command that writes the wheel to `path` with the interpreter `python`.
inline std::string demo_wheel_command(const std::string& python, const std::string& path) {
    return python +
           " -c \"import sys, zipfile\n"
           "z = zipfile.ZipFile(sys.argv[1], 'w')\n"
           "z.writestr('demo_pkg/__init__.py', 'VALUE = 42\\ndef main():\\n    print(\\'tool\\', "
           "VALUE)\\n')\n"
           "z.writestr('demo_pkg-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: "
           "demo-pkg\\nVersion: 1.0\\n')\n"
           "z.writestr('demo_pkg-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: "
           "test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n"
           "z.writestr('demo_pkg-1.0.dist-info/entry_points.txt', "
           "'[console_scripts]\\ndemo-tool = demo_pkg:main\\n')\n"
           "z.writestr('demo_pkg-1.0.dist-info/RECORD', '')\n"
           "z.close()\" " +
           path;
}

}  // namespace moat::test
