// Making a sandbox's output safe to show on the host's terminal. Output is untrusted bytes: an
// escape sequence in it (OSC 52 writes the host's clipboard, OSC 0 sets the window title, CSI
// clears the screen or moves the cursor, DCS talks to the terminal itself) would act on the
// terminal of whoever runs `moat run`, `moat exec` or `moat cp ... -`. When the destination is a
// terminal, the CLI passes each chunk through one terminal_safe (unless --raw); when it is not,
// the bytes go through unchanged so pipelines keep working.
#pragma once

#include <string>
#include <string_view>

namespace moat::cli {

// A streaming filter. Every control character except newline, tab and carriage return is
// rendered visibly: C0 controls and DEL in caret notation (ESC is "^[", BEL "^G", DEL "^?"), C1
// controls (U+0080 to U+009F in UTF-8, or a lone byte 0x80 to 0x9F outside any UTF-8 sequence)
// as "\x9b". Every other byte, including all valid UTF-8, passes unchanged. No ESC, C1 or other
// control byte can reach the output, whatever the split into chunks: a sequence starting in one
// chunk cannot finish in the next, because every ESC is rendered on its own. State across
// chunks is only where a UTF-8 sequence stands.
class terminal_safe {
  public:
    // The safe rendering of `data`, the next chunk of the stream.
    std::string filter(std::string_view data);
    // What the stream's last chunk left held (the lead byte of a possible C1 character).
    std::string finish();

  private:
    int continuation_ = 0;  // continuation bytes still expected by the current UTF-8 character
    bool held_c2_ = false;  // a 0xC2 lead byte, held until the next byte says if it opens a C1
};

// Whether `fd` is a terminal (the CLI filters only then).
bool is_terminal(int fd) noexcept;

}  // namespace moat::cli
