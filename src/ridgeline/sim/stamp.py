"""What a calibrated profile is only valid for: the code (git commit), the CPU and the thread count."""

import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import ridgeline
from ridgeline.errors import RidgelineError
from ridgeline.machine.cpu import cpu_model


@dataclass(frozen=True)
class Stamp:
    commit: str
    cpu: str
    threads: int
    model: str

    def mismatches(self, other: "Stamp") -> list[str]:
        mine, theirs = asdict(self), asdict(other)
        return [f"{key} {mine[key]!r} (profile) vs {theirs[key]!r} (here)" for key in mine if mine[key] != theirs[key]]

    def check(self, here: "Stamp", path: str | Path) -> None:
        """Refuse a profile measured elsewhere: its coefficients describe other code or another machine."""
        differences = self.mismatches(here)
        if differences:
            raise RidgelineError(f"profile {path} does not match this run: {'; '.join(differences)}; "
                                 f"measure again with `ridgeline profile`")


def git_commit() -> str:
    source = Path(ridgeline.__file__).resolve().parent
    try:
        result = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def current_stamp(model: str, threads: int) -> Stamp:
    return Stamp(git_commit(), cpu_model(), threads, model)
