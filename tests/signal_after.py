#!/usr/bin/env python3
"""Sends a running program a signal once its output shows that it got to a point, so
that the program can neither have finished nor run on far before the signal is there,
however slow or loaded the machine: the tests that stop or kill a run "after step N"
use it instead of polling a log and hoping the run is still going.

  signal_after.py --log LOG --after REGEX [--times N] [--delay S] [--signal SIG]
                  [--ranks N] -- PROGRAM ARGS...
      runs PROGRAM and exits with its exit code (128 + signal when a signal ended it)
  signal_after.py --log LOG --after REGEX ... --dir DIR --ranks N --send CMD [--alive CMD]
      the same for a job started elsewhere (a Slurm job), whose ranks write to DIR/out,
      a FIFO the caller made; exits 0 once the ranks' output has ended
  signal_after.py rank PROGRAM ARGS...
      how each rank of such a job starts: with $NCF_SIGNAL_DIR set, its stdout and
      stderr go to $NCF_SIGNAL_DIR/out and its pid to $NCF_SIGNAL_DIR/pid.RANK, then it
      becomes PROGRAM (same pid). A rank whose pid file exists already (a job's second
      start, after a requeue) and a process without $NCF_SIGNAL_DIR just become PROGRAM.

How: the program's output (stdout and stderr) reaches this script through a FIFO of one
page (4 KiB) and is copied to LOG as it comes. Once N lines have matched REGEX (Python
re.search), the script stops reading: past that line the program can write at most
the pipe's page and the 512 bytes this script had read ahead (and fill its own stdio
buffer, 4 KiB, unless it is line-buffered: stdbuf -oL) before it blocks in a write, so
a program that still has more than that to print (--step_log prints about 180 bytes a
step) is still running when the signal comes. After --delay seconds the signal
goes to PROGRAM (kill), or the --send command sends it (scancel ..., or with PROGRAM
anything that uses $NCF_SIGNAL_PID, PROGRAM's pid: two kills in a row). Then:
  - without --ranks the signal went straight to PROGRAM, which has it from then on;
  - with --ranks N, PROGRAM is a launcher (mpirun, or the Slurm job of --dir) whose N
    ranks started as `signal_after.py rank ...`: it is the ranks that must have the
    signal before they go on, and the launcher passes it on when it will (its own
    output goes straight to LOG: blocked on the FIFO, it would pass nothing on). So
    the ranks are stopped (SIGSTOP) before the signal is sent, and continued (SIGCONT)
    once every one of them has it pending (/proc/PID/status), which the launcher's
    forwarding decides, not the clock.
With --signal NONE, --send is not a signal but whatever must happen while the ranks are
held at that line (a host lost: sim_cluster.sh kill node2); they go on once it is done.
Then the script reads on to the end of the output.

--limit S (600) is a safety net, not a condition: a wait that lasts that long (the
program never printed the line, a launcher never passed the signal on) ends the script
with a message, the ranks continued and PROGRAM killed. --alive CMD (with --dir): a
shell command that fails once the job has ended; asked every second until the ranks'
first output, so that a job that died before it wrote anything ends the wait.
"""
import argparse
import errno
import fcntl
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
READ_AHEAD = 512  # bytes read at a time before the trigger: all it can run past it


def say(msg):
    print("signal_after: " + msg, file=sys.stderr, flush=True)


class GaveUp(Exception):
    pass


def rank_main(argv):
    if not argv:
        say("usage: signal_after.py rank PROGRAM ARGS...")
        return 2
    d = os.environ.get("NCF_SIGNAL_DIR", "")
    if d:
        rank = next((os.environ[v] for v in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
                     if os.environ.get(v, "") != ""), "0")
        pid_file = os.path.join(d, "pid." + rank)
        if not os.path.exists(pid_file):
            fd = os.open(os.path.join(d, "out"), os.O_WRONLY)  # waits for the reader
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            # Written once the output is connected, and whole (rename), so that a pid
            # file seen means a rank that writes to the FIFO.
            tmp = "%s.%d.tmp" % (pid_file, os.getpid())
            with open(tmp, "w") as f:
                f.write("%d\n" % os.getpid())
            os.rename(tmp, pid_file)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        say("cannot run %s: %s" % (argv[0], e))
        return 127


class Session:
    def __init__(self, a):
        self.a = a
        self.sig = a.signal
        self.deadline = time.monotonic() + a.limit
        self.child = None
        self.stopped = []  # pids this script stopped and has not continued
        self.made_dir = a.dir is None
        self.dir = a.dir or tempfile.mkdtemp(prefix="ncf-signal-",
                                             dir=os.environ.get("TMPDIR") or "/tmp")
        self.fifo = os.path.join(self.dir, "out")
        self.log = open(a.log, "ab")
        self.pending = b""
        self.seen = 0
        self.eof = False
        self.got_data = False

    # -- the output --------------------------------------------------------------------
    def open_output(self):
        if self.a.program:
            if not os.path.exists(self.fifo):
                os.mkfifo(self.fifo)
        elif not os.path.exists(self.fifo):
            raise GaveUp("%s does not exist (make it with mkfifo before the job starts)" %
                         self.fifo)
        # Non-blocking, so that opening does not wait for a writer; poll() reports
        # nothing until one came (Linux), then the end once all of them are gone.
        self.r = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            fcntl.fcntl(self.r, F_SETPIPE_SZ, 4096)
        except OSError:
            pass  # the pipe keeps its size: the bound is then that size
        self.poll = select.poll()
        self.poll.register(self.r, select.POLLIN)
        if self.a.program:
            # A launcher (--ranks) writes to LOG itself, not to the FIFO: it must never
            # block on the unread FIFO, or it could not pass the signal on (mpirun
            # prints "Forwarding signal 10 to job" before it does).
            if self.a.ranks:
                w = os.open(self.a.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            else:
                w = os.open(self.fifo, os.O_WRONLY)
            env = dict(os.environ, NCF_SIGNAL_DIR=self.dir)
            try:
                self.child = subprocess.Popen(self.a.program, stdout=w, stderr=w, env=env)
            except OSError as e:
                os.close(w)
                raise GaveUp("cannot run %s: %s" % (self.a.program[0], e))
            os.close(w)

    def check_limit(self, what):
        if time.monotonic() > self.deadline:
            raise GaveUp("gave up after %g s (--limit) waiting for %s" % (self.a.limit, what))

    def check_alive(self, what):
        # Only until the ranks' first output: from then on the end of the output is
        # the end of the job (a job state read after it could be one the job reached
        # after its output ended, e.g. requeued after the signal).
        if self.got_data or not self.a.alive:
            return
        if subprocess.run(self.a.alive, shell=True).returncode != 0 and not self.poll.poll(0):
            raise GaveUp("the job ended (--alive failed) while waiting for %s" % what)

    def read_some(self, size, what):
        """Reads what is there (at most size bytes) into the log; False at the end."""
        while True:
            self.check_limit(what)
            if self.poll.poll(1000):
                try:
                    data = os.read(self.r, size)
                except OSError as e:
                    if e.errno == errno.EAGAIN:
                        continue
                    raise
                if not data:
                    self.eof = True
                    return False
                self.got_data = True
                self.log.write(data)
                self.log.flush()
                return data
            self.check_alive(what)

    def wait_for_trigger(self):
        pattern = re.compile(self.a.after)
        what = "%d line(s) matching '%s'" % (self.a.times, self.a.after)
        while self.seen < self.a.times:
            data = self.read_some(READ_AHEAD, what)
            if data is False:
                raise GaveUp("the output ended after %d of %s" % (self.seen, what))
            self.pending += data
            *lines, self.pending = self.pending.split(b"\n")
            for line in lines:
                if pattern.search(line.decode("utf-8", "replace")):
                    self.seen += 1

    def drain(self):
        while self.read_some(65536, "the end of the output") is not False:
            pass

    # -- the ranks -------------------------------------------------------------------
    def rank_pids(self):
        # Each rank wrote its pid file before its program began, so all of them are
        # there once the output shows the ranks working together.
        pids = {}
        while True:
            for name in os.listdir(self.dir):
                m = re.fullmatch(r"pid\.(\d+)", name)
                if m and m.group(1) not in pids:
                    with open(os.path.join(self.dir, name)) as f:
                        pids[m.group(1)] = int(f.read())
            if len(pids) >= self.a.ranks:
                return sorted(pids.values())
            self.check_limit("the pid files of %d ranks in %s" % (self.a.ranks, self.dir))
            self.check_alive("the ranks' pid files")
            if self.child is not None and self.child.poll() is not None:
                raise GaveUp("%s ended before %d ranks wrote their pid files" %
                             (self.a.program[0], self.a.ranks))
            time.sleep(0.01)

    @staticmethod
    def status(pid):
        try:
            with open("/proc/%d/status" % pid) as f:
                return dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
        except (FileNotFoundError, ProcessLookupError):
            return None

    def wait_for(self, pids, cond, what):
        for pid in pids:
            while True:
                st = self.status(pid)
                if st is None:
                    raise GaveUp("rank pid %d is gone while waiting for %s" % (pid, what))
                if cond(st):
                    break
                self.check_limit(what)
                time.sleep(0.005)

    def stop_ranks(self, pids):
        for pid in pids:
            # A pid that is not this job's rank any more (reused after its rank ended)
            # is not touched.
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                raise GaveUp("rank pid %d is gone" % pid)
            if ("NCF_SIGNAL_DIR=" + self.dir).encode() not in env:
                raise GaveUp("pid %d is not a rank of this job any more" % pid)
            os.kill(pid, signal.SIGSTOP)
            self.stopped.append(pid)
        # Stopped for sure before the signal is sent: a rank still running when it
        # arrives would take it first (a lower number than SIGSTOP's) and leave nothing
        # pending to see.
        self.wait_for(pids, lambda st: st["State"].strip().startswith(("T", "t")),
                      "the ranks to stop")

    def continue_ranks(self):
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stopped = []

    # -- the whole -------------------------------------------------------------------
    def run(self):
        self.open_output()
        self.wait_for_trigger()
        if self.a.delay > 0:
            time.sleep(self.a.delay)
        pids = self.rank_pids() if self.a.ranks else []
        if pids:
            self.stop_ranks(pids)
        if self.a.send:
            env = dict(os.environ)
            if self.child is not None:
                env["NCF_SIGNAL_PID"] = str(self.child.pid)
            r = subprocess.run(self.a.send, shell=True, env=env)
            if r.returncode != 0:
                raise GaveUp("--send '%s' failed (exit %d)" % (self.a.send, r.returncode))
        else:
            self.child.send_signal(self.sig)
        if pids and self.sig:
            bit = 1 << (self.sig - 1)

            def has_it(st):
                return (int(st.get("SigPnd", "0"), 16) | int(st.get("ShdPnd", "0"), 16)) & bit

            self.wait_for(pids, has_it,
                          "every rank to have %s pending" % signal.Signals(self.sig).name)
        self.continue_ranks()
        self.drain()

    def finish(self):
        self.continue_ranks()
        rc = 0
        if hasattr(self, "r"):
            # Closed first: a writer left blocked on the unread FIFO gets EPIPE/SIGPIPE.
            os.close(self.r)
        if self.child is not None:
            if self.child.poll() is None and not self.eof:
                self.child.kill()
            rc = self.child.wait()
            if rc < 0:
                rc = 128 - rc
        self.log.close()
        if self.made_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        return rc


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        return rank_main(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log", required=True, help="the output is copied (appended) here")
    p.add_argument("--after", required=True, help="regular expression a line must match")
    p.add_argument("--times", type=int, default=1, help="signal at the N-th matching line")
    p.add_argument("--delay", type=float, default=0, help="seconds between that and the signal")
    p.add_argument("--signal", default="USR1",
                   help="USR1, TERM, KILL, ... (default USR1); NONE: --send acts, no signal")
    p.add_argument("--ranks", type=int, default=0, help="ranks that must have the signal")
    p.add_argument("--dir", help="a job's directory: DIR/out is the FIFO its ranks write")
    p.add_argument("--send", help="shell command that sends the signal ($NCF_SIGNAL_PID)")
    p.add_argument("--alive", help="shell command that fails once the job has ended")
    p.add_argument("--limit", type=float, default=600, help="safety net, seconds (600)")
    p.add_argument("program", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if a.program and a.program[0] == "--":
        a.program = a.program[1:]
    if a.signal.upper() == "NONE":
        a.signal = 0
        if not a.send:
            p.error("--signal NONE needs --send")
    else:
        a.signal = signal.Signals["SIG" + a.signal.upper().removeprefix("SIG")].value
    if bool(a.program) == bool(a.dir):
        p.error("give either -- PROGRAM ARGS... or --dir DIR")
    if a.dir and not (a.send and a.ranks):
        p.error("--dir needs --send and --ranks")
    if a.ranks and a.signal in (signal.SIGKILL, signal.SIGSTOP):
        p.error("--ranks: a pending %s cannot be seen" % signal.Signals(a.signal).name)
    s = Session(a)
    ok = True

    def on_term(sig, frame):  # an outer `timeout`: the ranks must not stay stopped
        raise GaveUp("ended by %s" % signal.Signals(sig).name)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        s.run()
    except GaveUp as e:
        say(str(e))
        ok = False
    rc = s.finish()
    if not ok:
        return rc if rc != 0 else 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
