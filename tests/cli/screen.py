"""A small terminal for tests: it replays what a program wrote to a pty and keeps what is left
on the screen, so a test can tell a progress bar's last drawing from the ones it overwrote."""

import re

# The control sequences rich's live display writes: cursor moves, erase, colours, cursor shown.
CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")


def final_screen(output: str) -> list[str]:
    """The screen's lines after `output`, without colours; rows scrolled off are kept."""
    lines, row, col, i = [""], 0, 0, 0
    while i < len(output):
        m = CSI.match(output, i)
        if m:
            n = int(m[1]) if m[1].isdigit() else None
            if m[2] == "A":
                row = max(0, row - (n or 1))
            elif m[2] == "G":
                col = (n or 1) - 1
            elif m[2] == "K":
                line = lines[row]
                lines[row] = "" if n == 2 else " " * col + line[col:] if n == 1 else line[:col]
            i = m.end()
            continue
        char, i = output[i], i + 1
        if char == "\r":
            col = 0
        elif char == "\n":
            row += 1
            lines.extend("" for _ in range(row + 1 - len(lines)))
        elif char >= " ":
            line = lines[row].ljust(col)
            lines[row] = line[:col] + char + line[col + 1:]
            col += 1
    return [line.rstrip() for line in lines]
