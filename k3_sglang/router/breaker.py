"""Per-worker circuit breaker. Pure; callers pass monotonic `now` in seconds.

closed -> open after `failure_threshold` consecutive failures -> half-open once `open_s` passed ->
closed after `success_threshold` successes, counting both trial requests and health probes.
Half-open admits up to `half_open_trials` requests at once, so a burst after an outage is not cut
down to one request per worker, and a worker the policy never picks still closes on its probes.
A failure while half-open opens it again. Back-pressure (a worker's 429) is not a failure.
"""

from __future__ import annotations

from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_CODES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}


@dataclass(slots=True)
class CircuitBreaker:
    """Failure counting for one worker."""

    failure_threshold: int
    success_threshold: int
    open_s: float
    half_open_trials: int = 4
    state: str = CLOSED
    failures: int = 0
    successes: int = 0
    opened_at: float = 0.0
    trials_in_flight: int = 0
    times_opened: int = 0

    def can_dispatch(self, now: float) -> bool:
        """Whether a request may be sent now (moves open -> half-open once the cool-down passed)."""
        self._cool_down(now)
        if self.state == OPEN:
            return False
        return self.state == CLOSED or self.trials_in_flight < self.half_open_trials

    def on_dispatch(self) -> bool:
        """A request was sent; returns True when it is a half-open trial (release it exactly once)."""
        if self.state != HALF_OPEN:
            return False
        self.trials_in_flight += 1
        return True

    def record_success(self, trial: bool = False) -> None:
        """The worker answered properly (`trial`: the request was dispatched as a half-open trial)."""
        self._end_trial(trial)
        self.failures = 0
        if self.state == HALF_OPEN:
            self._count_success()

    def record_failure(self, now: float, trial: bool = False) -> None:
        """The worker failed (connection error, 5xx, broken stream, timeout)."""
        self._end_trial(trial)
        if self.state == HALF_OPEN:
            self._open(now)
            return
        self.failures += 1
        if self.state == CLOSED and self.failures >= self.failure_threshold:
            self._open(now)

    def release_trial(self, trial: bool = True) -> None:
        """A request ended without a verdict (client cancel, back-pressure); free its trial."""
        self._end_trial(trial)

    def record_probe(self, ok: bool, now: float) -> None:
        """A health probe result: successes count toward closing a half-open breaker."""
        self._cool_down(now)
        if ok and self.state == HALF_OPEN:
            self._count_success()

    def _cool_down(self, now: float) -> None:
        if self.state == OPEN and now - self.opened_at >= self.open_s:
            self.state, self.successes = HALF_OPEN, 0

    def _count_success(self) -> None:
        self.successes += 1
        if self.successes >= self.success_threshold:
            self.state, self.successes, self.failures = CLOSED, 0, 0

    def _end_trial(self, trial: bool) -> None:
        if trial and self.trials_in_flight > 0:
            self.trials_in_flight -= 1

    def _open(self, now: float) -> None:
        self.state, self.opened_at, self.failures, self.successes = OPEN, now, 0, 0
        self.times_opened += 1
