"""Where a pipeline batch runs: on this machine (`LocalBackend`) or on corral (`ServiceBackend`)."""
