"""`corral up`: the whole system on one machine, each service its own process, supervised.

Each module owns one concern:

- `cli`: the `corral up` command and its flags (a `corral.commands` entry point; it imports the rest only
  when `corral up` runs).
- `config`: `UpConfig`, what `corral up` runs (a frozen dataclass, each field with its default).
- `serve`: the foreground: start, print the endpoints and where the admin token is, supervise until asked to stop or a
  part cannot be kept running, stop; the exit codes.
- `app`: the wiring: the data directory and its lock, each service's arguments and environment, the order
  in which everything starts, and the order in which `Running.stop` ends it.
- `database`: the private MariaDB as a part, migrations, each service's account, the administrator and the
  `default` billing project, the local pools' shape.
- `certificates`: the development CA, each service's certificate directory, the key pair job secrets are
  sealed for.
- `ports`: free ports below the kernel's ephemeral range.
- `supervisor`: every process as a part, restarted with back-off, given up on when it cannot be kept
  running; the data directory's lock and what an earlier `corral up` left.
- `gateway`: with --gateway, the public and internal Envoy gateways as parts.
- `metrics`: with --metrics, the Prometheus scrape targets of every process.
- `process`: `corral up` as a child process, for end-to-end tests, fault programs and benchmarks.

This package imports nothing at its top, so that loading `cli` (which every `corral` command does) stays
cheap.
"""
