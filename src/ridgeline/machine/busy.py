"""Whether other work shared this machine's cores while something was measured.

A calibration (`ridgeline profile`) fits step times; if another job ran beside it, every step it timed was slowed
by an amount the fit cannot see, and the simulator then prices this machine as slower than it is (a profile
taken beside another job fitted a 146 ms fixed step, issue 32). The check here is accounting, not inference:
over the measurement, the kernel's count of all busy CPU time (/proc/stat: user, nice, system, irq, softirq and
the hypervisor's steal) less the CPU time of our own processes (/proc/PID/stat of this process and every
descendant, plus any extra process named, e.g. a `ridgeline serve` found by its port) is what others took.
It does not depend on how noisy our own steps are, nor on what a quiet step "should" cost: a busy reading is
another process holding a core, whatever our load was. The alternatives were weaker: our own CPU time against
wall time also falls when our threads wait for each other or for the GIL (a server does, by design), and the
spread of repeated probe steps needs probes long enough to see a neighbour that only runs now and then.

Children that exit during the measurement are counted through their parent's cutime/cstime once reaped, so a
server stopped and waited for inside the window stays ours.
"""

import os
from dataclasses import dataclass
from pathlib import Path

# Share of all cores' time that other processes may take before a measurement counts as taken under load: a
# fifth of a core on 2 cores. An idle VM's daemons take ~1 %; a short unit-test run beside a 4-minute calibration
# ~2 %; one other busy thread on 2 cores 50 %.
BUSY_LIMIT = 0.10
LISTEN = "0A"  # /proc/net/tcp state of a listening socket


@dataclass(frozen=True)
class CpuSample:
    total: float  # jiffies of all cores, every state (idle included)
    busy: float  # jiffies of all cores not idle or waiting for I/O (steal included: another guest held our core)
    ours: float  # jiffies of our processes (utime + stime + reaped children's cutime + cstime)


@dataclass(frozen=True)
class LoadReading:
    """What the cores did over a measurement."""
    seconds: float  # of all cores' time observed, in core-seconds
    other_share: float  # of that, the share other processes (and steal) took
    our_share: float  # ... and the share ours took

    @property
    def busy(self) -> bool:
        return self.other_share > BUSY_LIMIT

    def describe(self) -> str:
        return (f"other processes took {self.other_share:.0%} of the cores' time while it was measured "
                f"(limit {BUSY_LIMIT:.0%}; ours {self.our_share:.0%})")


def _stat_fields(text: str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    return text[text.rindex(")") + 2:].split()


class LoadMeter:
    """`meter = LoadMeter(); meter.start(); ...; reading = meter.stop()`: the share of the machine's CPU time that
    processes other than ours took in between. `proc` is where /proc is (tests point it at a fake one)."""

    def __init__(self, proc: str | Path = "/proc", roots: tuple[int, ...] | None = None):
        self.proc = Path(proc)
        self.roots = list(roots if roots is not None else (os.getpid(),))
        self._start: CpuSample | None = None

    def add_root(self, pid: int) -> None:
        """Count this process (and its descendants) as ours from now on: call before start()."""
        if pid not in self.roots:
            self.roots.append(pid)

    def sample(self) -> CpuSample:
        line = (self.proc / "stat").read_text().splitlines()[0].split()
        # user nice system idle iowait irq softirq steal [guest guest_nice]: guests are already in user and nice
        values = [float(v) for v in line[1:9]]
        total = sum(values)
        busy = total - values[3] - values[4]
        return CpuSample(total, busy, self._ours())

    def _ours(self) -> float:
        parents: dict[int, int] = {}
        times: dict[int, float] = {}
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = _stat_fields((entry / "stat").read_text())
            except (OSError, ValueError):
                continue  # gone since the listing
            pid = int(entry.name)
            # fields[1] is ppid; utime, stime, cutime, cstime are fields 14-17 of stat, [11:15] here
            parents[pid] = int(fields[1])
            times[pid] = sum(float(v) for v in fields[11:15])
        ours = set(self.roots) & times.keys()
        grew = True
        while grew:  # descendants, however deep
            before = len(ours)
            ours |= {pid for pid, parent in parents.items() if parent in ours}
            grew = len(ours) > before
        return sum(times[pid] for pid in ours)

    def start(self) -> None:
        self._start = self.sample()

    def stop(self) -> LoadReading:
        if self._start is None:
            raise RuntimeError("LoadMeter.stop() before start()")
        end, start = self.sample(), self._start
        total = max(end.total - start.total, 1.0)
        ours = max(end.ours - start.ours, 0.0)
        others = max(end.busy - start.busy - ours, 0.0)
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        return LoadReading(total / hz, min(others / total, 1.0), min(ours / total, 1.0))


def listening_pid(port: int, proc: str | Path = "/proc") -> int | None:
    """The process that listens on this TCP port (a server this process did not start), if it can be seen."""
    proc = Path(proc)
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    return int(entry.name)
        except OSError:
            continue  # another user's process, or gone
    return None
