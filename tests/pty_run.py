"""pty_run.py OUT COMMAND... - runs COMMAND with a pseudo-terminal as its stdout and stderr (as a
user's terminal), writes everything it printed to OUT byte for byte, and exits with its status."""
import os
import pty
import sys

pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
out = b""
while True:
    try:
        chunk = os.read(fd, 65536)
    except OSError:  # the child closed the terminal
        break
    if not chunk:
        break
    out += chunk
open(sys.argv[1], "wb").write(out)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
