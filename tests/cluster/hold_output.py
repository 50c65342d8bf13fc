#!/usr/bin/env python3
"""Holds a run at a line of its output, without stopping it: for the tests that must act
on a run (lose a host under it, start a second job beside it) before it can end.

  hold_output.py FIFO OUT REGEX HELD

FIFO is a named pipe the run's ranks write their standard output into (each opens it
for writing). This script makes its buffer one page (4 KiB), copies what comes through
to OUT up to and including the first line matching REGEX (Python re.search), then
creates the file HELD and reads no more, keeping FIFO open until it is killed. A rank
that writes on from then on blocks once the pipe and its own stdio buffer are full (a
page or two: --step_log writes about 180 bytes a step), so a run that still has more
than that to print cannot end; its other threads (heartbeats, the peer watch, a lock's
refresh) go on, and its standard error, sent elsewhere, is never held.

FIFO is opened for reading and writing, so its size is set before any rank has written
and the open does not wait for one; the caller tells a run that ended before the line
by the run's process, not by this script, which then simply waits to be killed.
"""
import fcntl
import os
import re
import sys
import time

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: hold_output.py FIFO OUT REGEX HELD")
    fifo, out, regex, held = sys.argv[1:]
    pattern = re.compile(regex.encode())
    fd = os.open(fifo, os.O_RDWR)
    fcntl.fcntl(fd, F_SETPIPE_SZ, 4096)
    pending = b""
    with open(out, "wb") as o:
        while True:
            chunk = os.read(fd, 512)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                o.write(line + b"\n")
                o.flush()
                if pattern.search(line):
                    open(held, "w").close()
                    while True:  # read no more; keep the pipe open
                        time.sleep(3600)


if __name__ == "__main__":
    main()
