"""K3_CSV tooling: the verification simulator and the step-cost fit of `k3 bench profile-verify`."""
