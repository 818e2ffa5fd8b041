"""What every corral service shares: TLS, identity, errors, serving."""
