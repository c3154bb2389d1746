"""Per-worker circuit breaker: closed -> open after N consecutive failures -> half-open after a
cool-down (one trial request at a time) -> closed after M consecutive trial successes. Pure."""

from __future__ import annotations

from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_CODES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}


@dataclass(slots=True)
class CircuitBreaker:
    """Failure counting for one worker; callers pass monotonic `now` in seconds."""

    failure_threshold: int
    success_threshold: int
    open_s: float
    state: str = CLOSED
    failures: int = 0
    successes: int = 0
    opened_at: float = 0.0
    trial_in_flight: bool = False
    times_opened: int = 0

    def can_dispatch(self, now: float) -> bool:
        """Whether a request may be sent now (moves open -> half-open once the cool-down passed)."""
        if self.state == OPEN and now - self.opened_at >= self.open_s:
            self.state, self.successes, self.trial_in_flight = HALF_OPEN, 0, False
        if self.state == OPEN:
            return False
        return not (self.state == HALF_OPEN and self.trial_in_flight)

    def on_dispatch(self) -> None:
        """A request was sent; in half-open it is the one trial allowed at a time."""
        if self.state == HALF_OPEN:
            self.trial_in_flight = True

    def record_success(self) -> None:
        """The worker answered properly."""
        self.failures = 0
        if self.state == HALF_OPEN:
            self.trial_in_flight = False
            self.successes += 1
            if self.successes >= self.success_threshold:
                self.state = CLOSED

    def record_failure(self, now: float) -> None:
        """The worker failed (connection error, 5xx, broken stream, timeout)."""
        self.trial_in_flight = False
        if self.state == HALF_OPEN:
            self._open(now)
            return
        self.failures += 1
        if self.state == CLOSED and self.failures >= self.failure_threshold:
            self._open(now)

    def release_trial(self) -> None:
        """A trial ended without a verdict (client cancelled); let another trial go."""
        self.trial_in_flight = False

    def _open(self, now: float) -> None:
        self.state, self.opened_at, self.failures, self.successes = OPEN, now, 0, 0
        self.times_opened += 1
