"""The CLI's options that take a duration or a size read them as people write them (corral.quantities):
`--max-job-duration 2h`, `--tail 64Ki`; a wrong unit is one `error:` line naming the accepted ones, exit 2,
before any call."""

from __future__ import annotations

import pytest

from corral.cli import build_parser, main
from corral.cli_common import EXIT_USAGE


@pytest.mark.parametrize(("argv", "name", "value"), [
    (["billing", "limit", "lab", "5", "--max-job-duration", "2h"], "max_job_duration", 7200.0),
    (["billing", "limit", "lab", "5", "--max-job-duration", "1h30m"], "max_job_duration", 5400.0),
    (["billing", "limit", "lab", "5", "--max-job-duration", "3600"], "max_job_duration", 3600.0),
    (["logs", "7", "1", "--tail", "64Ki"], "tail", 65536),
    (["logs", "7", "1", "--tail", "1M"], "tail", 1_000_000),
    (["logs", "7", "1", "--tail", "100"], "tail", 100),
])
def test_options_take_units(argv: list[str], name: str, value: float) -> None:
    assert getattr(build_parser().parse_args(argv), name) == value


@pytest.mark.parametrize(("argv", "line"), [
    (["billing", "limit", "lab", "5", "--max-job-duration", "2hours"],
     'error: argument --max-job-duration: "2hours": unknown unit "hours"; use ms, s, m (minutes), h or d, e.g. 90s, '
     '30m, 2h or 1h30m; did you mean "h"? (see `corral billing limit --help`)'),
    (["logs", "7", "1", "--tail", "64KB"],
     'error: argument --tail: "64KB": unknown unit "KB"; use Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T (powers '
     'of 1000), e.g. 512Mi or 4G (see `corral logs --help`)'),
])
def test_a_wrong_unit_is_one_line_and_exit_2(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == EXIT_USAGE
    assert capsys.readouterr().err == line + "\n"
