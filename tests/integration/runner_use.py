"""Which test modules run pods on the process runner, and whether each says why (issue 20).

What a kubelet enforces (security context, probes, volumes, signals) is proven on real nodes;
a module whose pods the process runner runs instead carries
``pytest.mark.process_runner(reason)``, the reason in one line. After every test the session's
node agent log is read on from where it was left, and each pod the runner started in the
meantime is counted for that test's module. The session's summary names the modules that ran
runner pods without a reason, and the reasons that no longer have a pod behind them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "process_runner"
# The runner's line for every pod it starts (runner.PodRunner: ``<namespace>/<name>``).
_STARTED = re.compile(r"starting pod (\S+) on ")


def started_pods(text: str) -> list[str]:
    """The pods (``<namespace>/<name>``) a piece of the agent's log says it started."""
    return _STARTED.findall(text)


@dataclass
class RunnerUse:
    """Pods the runner started, by test module, read incrementally from the agent's log."""

    log: Path
    offset: int = 0
    pods: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def count(self, module: str) -> None:
        """What the log gained since the last call goes to ``module`` (whole lines only)."""
        if not self.log.exists():
            return
        with self.log.open("rb") as log:
            log.seek(self.offset)
            gained = log.read()
        whole = gained[: gained.rfind(b"\n") + 1]
        self.offset += len(whole)
        self.pods[module].update(started_pods(whole.decode(errors="replace")))

    def report(self, reasons: dict[str, str | None]) -> list[str]:
        """Lines for the session's summary: ``reasons`` maps each module run to its stated
        reason (None: it states none)."""
        used = {m for m, pods in self.pods.items() if pods}
        lines = [f"{m}: {len(self.pods[m])} pods on the process runner, no reason given "
                 f"(pytest.mark.{MARKER})" for m in sorted(used) if reasons.get(m) is None]  # fmt: skip
        lines += [f"{m}: gives a reason for the process runner but ran no pod on it"
                  for m in sorted(reasons) if reasons[m] is not None and m not in used]  # fmt: skip
        return lines
