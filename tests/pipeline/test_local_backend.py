"""hailtop.batch's test_batch_local_backend.py, carried over to corral.pipeline's LocalBackend: each test asserts
what the original does. Jobs run as processes of this machine (the original runs some in Docker), so a test
that named an image keeps it (it is not used)."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from random import choice, randint
from string import whitespace

import pytest

import corral.pipeline as hb
from corral.pipeline import Batch, LocalBackend, ResourceGroup
from corral.pipeline.resource import JobResourceFile
from corral.pipeline.utils import concatenate

DOCKER_ROOT_IMAGE = "debian"


def contents(path: str) -> str:
    return Path(path).read_text()


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    with LocalBackend(tmp_dir=str(tmp_path_factory.mktemp("scratch"))) as lb:
        yield lb


@pytest.fixture
def batch(backend: LocalBackend) -> Batch:
    return Batch(backend=backend)


def test_read_input_and_write_output(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as input_file, tempfile.NamedTemporaryFile("w") as output_file:
        input_file.write("abc")
        input_file.flush()
        b = batch
        input = b.read_input(input_file.name)
        b.write_output(input, output_file.name)
        b.run()
        assert contents(input_file.name) == contents(output_file.name)


def test_read_input_group(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as input_file1, tempfile.NamedTemporaryFile("w") as input_file2, \
            tempfile.NamedTemporaryFile("w") as output_file1, tempfile.NamedTemporaryFile("w") as output_file2:
        input_file1.write("abc")
        input_file2.write("123")
        input_file1.flush()
        input_file2.flush()
        b = batch
        input = b.read_input_group(in1=input_file1.name, in2=input_file2.name)
        b.write_output(input.in1, output_file1.name)
        b.write_output(input.in2, output_file2.name)
        b.run()
        assert contents(input_file1.name) == contents(output_file1.name)
        assert contents(input_file2.name) == contents(output_file2.name)


def test_write_resource_group(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as input_file1, tempfile.NamedTemporaryFile("w") as input_file2, \
            tempfile.TemporaryDirectory() as output_dir:
        b = batch
        input = b.read_input_group(in1=input_file1.name, in2=input_file2.name)
        b.write_output(input, output_dir + "/foo")
        b.run()
        assert contents(input_file1.name) == contents(output_dir + "/foo.in1")
        assert contents(input_file2.name) == contents(output_dir + "/foo.in2")


def test_single_job(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        msg = "hello world"
        b = batch
        j = b.new_job()
        j.command(f'printf "{msg}" > {j.ofile}')
        b.write_output(j.ofile, output_file.name)
        b.run()
        assert contents(output_file.name) == msg


def test_single_job_with_shell(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        msg = "hello world"
        b = batch
        j = b.new_job(shell="/bin/bash")
        j.command(f'printf "{msg}" > {j.ofile}')
        b.write_output(j.ofile, output_file.name)
        b.run()
        assert contents(output_file.name) == msg


def test_single_job_with_nonsense_shell(batch: Batch) -> None:
    b = batch
    j = b.new_job(shell="/bin/ajdsfoijasidojf")
    j.image(DOCKER_ROOT_IMAGE)
    j.command('printf "hello"')
    with pytest.raises(Exception):
        b.run()

    b = Batch(backend=batch._backend)
    j = b.new_job(shell="/bin/nonexistent")
    j.command('printf "hello"')
    with pytest.raises(Exception):
        b.run()


def test_single_job_with_intermediate_failure(batch: Batch) -> None:
    b = batch
    j = b.new_job()
    j.command('echoddd "hello"')
    j2 = b.new_job()
    j2.command('echo "world"')
    with pytest.raises(Exception):
        b.run()


def test_single_job_w_input(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as input_file, tempfile.NamedTemporaryFile("w") as output_file:
        msg = "abc"
        input_file.write(msg)
        input_file.flush()
        b = batch
        input = b.read_input(input_file.name)
        j = b.new_job()
        j.command(f"cat {input} > {j.ofile}")
        b.write_output(j.ofile, output_file.name)
        b.run()
        assert contents(output_file.name) == msg


def test_single_job_w_input_group(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as input_file1, tempfile.NamedTemporaryFile("w") as input_file2, \
            tempfile.NamedTemporaryFile("w") as output_file:
        msg1, msg2 = "abc", "123"
        input_file1.write(msg1)
        input_file2.write(msg2)
        input_file1.flush()
        input_file2.flush()
        b = batch
        input = b.read_input_group(in1=input_file1.name, in2=input_file2.name)
        j = b.new_job()
        j.command(f"cat {input.in1} {input.in2} > {j.ofile}")
        j.command(f"cat {input}.in1 {input}.in2")
        b.write_output(j.ofile, output_file.name)
        b.run()
        assert contents(output_file.name) == msg1 + msg2


def test_single_job_bad_command(batch: Batch) -> None:
    b = batch
    j = b.new_job()
    j.command("foo")  # this should fail!
    with pytest.raises(subprocess.CalledProcessError):
        b.run()


@pytest.mark.parametrize("seed", range(20))
def test_single_job_empty_command(batch: Batch, seed: int) -> None:
    randwhitespace = "".join(choice(whitespace) for _ in range(randint(0, 9)))
    j = batch.new_job()
    with pytest.warns(match="Ignoring empty command"):
        j.command(randwhitespace)


def test_declare_resource_group(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        msg = "hello world"
        b = batch
        j = b.new_job()
        j.declare_resource_group(ofile={"log": "{root}.txt"})
        assert isinstance(j.ofile, ResourceGroup)
        j.command(f'printf "{msg}" > {j.ofile.log}')
        b.write_output(j.ofile.log, output_file.name)
        b.run()
        assert contents(output_file.name) == msg


def test_resource_group_get_all_inputs(batch: Batch) -> None:
    b = batch
    input = b.read_input_group(fasta="foo", idx="bar")
    j = b.new_job()
    j.command(f"cat {input.fasta}")
    assert input.fasta in j._inputs
    assert input.idx in j._inputs


def test_resource_group_get_all_mentioned(batch: Batch) -> None:
    b = batch
    j = b.new_job()
    j.declare_resource_group(foo={"bed": "{root}.bed", "bim": "{root}.bim"})
    assert isinstance(j.foo, ResourceGroup)
    j.command(f"cat {j.foo.bed}")
    assert j.foo.bed in j._mentioned
    assert j.foo.bim not in j._mentioned


def test_resource_group_get_all_mentioned_dependent_jobs(batch: Batch) -> None:
    b = batch
    j = b.new_job()
    j.declare_resource_group(foo={"bed": "{root}.bed", "bim": "{root}.bim"})
    j.command("cat")
    j2 = b.new_job()
    j2.command(f"cat {j.foo}")


def test_resource_group_get_all_outputs(batch: Batch) -> None:
    b = batch
    j1 = b.new_job()
    j1.declare_resource_group(foo={"bed": "{root}.bed", "bim": "{root}.bim"})
    assert isinstance(j1.foo, ResourceGroup)
    j1.command(f"cat {j1.foo.bed}")
    j2 = b.new_job()
    j2.command(f"cat {j1.foo.bed}")
    for r in [j1.foo.bed, j1.foo.bim]:
        assert r in j1._internal_outputs
        assert r in j2._inputs
    assert j1.foo.bed in j1._mentioned
    assert j1.foo.bim not in j1._mentioned
    assert j1.foo.bed in j2._mentioned
    assert j1.foo.bim not in j2._mentioned
    assert j1.foo not in j1._mentioned


def test_multiple_isolated_jobs(batch: Batch) -> None:
    b = batch
    output_files = [tempfile.NamedTemporaryFile("w") for _ in range(5)]
    try:
        for i, ofile in enumerate(output_files):
            j = b.new_job()
            j.command(f'printf "hello world {i}" > {j.ofile}')
            b.write_output(j.ofile, ofile.name)
        b.run()
        for i, ofile in enumerate(output_files):
            assert contents(ofile.name) == f"hello world {i}"
    finally:
        for ofile in output_files:
            ofile.close()


def test_multiple_dependent_jobs(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        b = batch
        j = b.new_job()
        j.command(f'echo "0" >> {j.ofile}')
        for i in range(1, 3):
            j2 = b.new_job()
            j2.command(f'echo "{i}" > {j2.tmp1}')
            j2.command(f"cat {j.ofile} {j2.tmp1} > {j2.ofile}")
            j = j2
        b.write_output(j.ofile, output_file.name)
        b.run()
        assert contents(output_file.name) == "0\n1\n2\n"


def test_select_jobs(batch: Batch) -> None:
    b = batch
    for i in range(3):
        b.new_job(name=f"foo{i}")
    assert len(b.select_jobs("foo")) == 3


def test_scatter_gather(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        b = batch
        for i in range(3):
            j = b.new_job(name=f"foo{i}")
            j.command(f'echo "{i}" > {j.ofile}')
        merger = b.new_job()
        merger.command("cat {files} > {ofile}".format(
            files=" ".join([j.ofile for j in sorted(b.select_jobs("foo"), key=lambda x: x.name, reverse=True)]),
            ofile=merger.ofile))
        b.write_output(merger.ofile, output_file.name)
        b.run()
        assert contents(output_file.name) == "2\n1\n0\n"


def test_add_extension_job_resource_file(batch: Batch) -> None:
    b = batch
    j = b.new_job()
    j.command(f'echo "hello" > {j.ofile}')
    assert isinstance(j.ofile, JobResourceFile)
    j.ofile.add_extension(".txt.bgz")
    assert j.ofile._value
    assert j.ofile._value.endswith(".txt.bgz")


def test_add_extension_input_resource_file(batch: Batch) -> None:
    input_file1 = "/tmp/data/example1.txt.bgz.foo"
    b = batch
    in1 = b.read_input(input_file1)
    assert in1._value
    assert in1._value.endswith(".txt.bgz.foo")


def test_file_name_space(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w", prefix="some file name with (foo) spaces") as input_file, \
            tempfile.NamedTemporaryFile("w", prefix="another file name with (foo) spaces") as output_file:
        input_file.write("abc")
        input_file.flush()
        b = batch
        input = b.read_input(input_file.name)
        j = b.new_job()
        j.command(f"cat {input} > {j.ofile}")
        b.write_output(j.ofile, output_file.name)
        b.run()
        assert contents(input_file.name) == contents(output_file.name)


def test_resource_group_mentioned(batch: Batch) -> None:
    b = batch
    j = b.new_job()
    j.declare_resource_group(foo={"bed": "{root}.bed"})
    assert isinstance(j.foo, ResourceGroup)
    j.command(f'echo "hello" > {j.foo}')
    t2 = b.new_job()
    t2.command(f'echo "hello" >> {j.foo.bed}')
    b.run()


def test_envvar(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        b = batch
        j = b.new_job()
        j.env("SOME_VARIABLE", "123abcdef")
        j.command(f"printf $SOME_VARIABLE > {j.ofile}")
        b.write_output(j.ofile, output_file.name)
        b.run()
        assert contents(output_file.name) == "123abcdef"


def test_concatenate(batch: Batch) -> None:
    b = batch
    files = []
    for _ in range(10):
        j = b.new_job()
        j.command(f"touch {j.ofile}")
        files.append(j.ofile)
    concatenate(b, files, branching_factor=2)
    assert len(b._jobs) == 10 + (5 + 3 + 2 + 1)
    b.run()


def test_python_job(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        b = batch
        head = b.new_job()
        head.command(f'echo "5" > {head.r5}')
        head.command(f'echo "3" > {head.r3}')

        def read(path):
            with open(path) as f:
                i = f.read()
            return int(i)

        def multiply(x, y):
            return x * y

        def reformat(x, y):
            return {"x": x, "y": y}

        middle = b.new_python_job()
        r3 = middle.call(read, head.r3)
        r5 = middle.call(read, head.r5)
        r_mult = middle.call(multiply, r3, r5)

        middle2 = b.new_python_job()
        r_mult = middle2.call(multiply, r_mult, 2)
        r_dict = middle2.call(reformat, r3, r5)

        tail = b.new_job()
        tail.command(f"cat {r3.as_str()} {r5.as_repr()} {r_mult.as_str()} {r_dict.as_json()} > {tail.ofile}")
        b.write_output(tail.ofile, output_file.name)
        b.run()
        assert contents(output_file.name) == '3\n5\n30\n{"x": 3, "y": 5}\n'


def test_backend_context_manager(tmp_path: Path) -> None:
    with LocalBackend(tmp_dir=str(tmp_path)) as backend:
        b = Batch(backend=backend)
        b.run()


def test_failed_jobs_dont_stop_non_dependent_jobs(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        b = batch
        head = b.new_job()
        head.command(f"printf 1 > {head.ofile}")
        head2 = b.new_job()
        head2.command("false")
        tail = b.new_job()
        tail.command(f"cat {head.ofile} > {tail.ofile}")
        b.write_output(tail.ofile, output_file.name)
        with pytest.raises(Exception):
            b.run()
        assert contents(output_file.name) == "1"


def test_failed_jobs_stop_child_jobs(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        b = batch
        head = b.new_job()
        head.command(f"printf 1 > {head.ofile}")
        head.command("false")
        head2 = b.new_job()
        head2.command(f"printf 2 > {head2.ofile}")
        tail = b.new_job()
        tail.command(f"cat {head.ofile} > {tail.ofile}")
        b.write_output(head2.ofile, output_file.name)
        b.write_output(tail.ofile, output_file.name)
        with pytest.raises(Exception):
            b.run()
        assert contents(output_file.name) == "2"


def test_failed_jobs_stop_grandchild_jobs(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        b = batch
        head = b.new_job()
        head.command(f"printf 1 > {head.ofile}")
        head.command("false")
        head2 = b.new_job()
        head2.command(f"printf 2 > {head2.ofile}")
        tail = b.new_job()
        tail.command(f"cat {head.ofile} > {tail.ofile}")
        tail2 = b.new_job()
        tail2.depends_on(tail)
        tail2.command(f"printf foo > {tail2.ofile}")
        b.write_output(head2.ofile, output_file.name)
        b.write_output(tail2.ofile, output_file.name)
        with pytest.raises(Exception):
            b.run()
        assert contents(output_file.name) == "2"


def test_failed_jobs_dont_stop_always_run_jobs(batch: Batch) -> None:
    with tempfile.NamedTemporaryFile("w") as output_file:
        b = batch
        head = b.new_job()
        head.command(f"printf 1 > {head.ofile}")
        head.command("false")
        tail = b.new_job()
        tail.command(f"cat {head.ofile} > {tail.ofile}")
        tail.always_run()
        b.write_output(tail.ofile, output_file.name)
        with pytest.raises(Exception):
            b.run()
        assert contents(output_file.name) == "1"


def test_a_missing_output_fails_the_job_naming_the_file(batch: Batch, tmp_path: Path) -> None:
    """Not in the original: issue 37's acceptance 4 on this backend."""
    j = batch.new_job(name="quiet")
    j.command(f"echo nothing written to {j.ofile}")
    batch.write_output(j.ofile, str(tmp_path / "never.txt"))
    with pytest.raises(subprocess.CalledProcessError) as failed:
        batch.run()
    assert "its output 'ofile' was not written" in failed.value.output.decode()


def test_jobs_run_at_once_up_to_the_parallelism(tmp_path: Path) -> None:
    """Not in the original (which runs one job at a time): independent jobs overlap. Each job waits until both
    have started, so the batch finishes only if they run together."""
    with LocalBackend(tmp_dir=str(tmp_path), parallelism=2) as backend:
        b = Batch(backend=backend)
        for name in ("a", "b"):
            j = b.new_job(name=name).timeout(30)
            other = "b" if name == "a" else "a"
            j.command(f"touch {tmp_path}/{name}; while [ ! -e {tmp_path}/{other} ]; do sleep 0.01; done")
        b.run()


def test_a_second_run_runs_only_the_new_jobs_and_refuses_earlier_files(batch: Batch, tmp_path: Path) -> None:
    """Not in the original: as on the service, a run after adding jobs runs only those."""
    first = batch.new_job()
    first.command(f"echo once >> {tmp_path}/runs; echo x > {first.ofile}")
    batch.run()
    second = batch.new_job()
    second.command(f"echo again >> {tmp_path}/runs")
    second.depends_on(first)
    batch.run()
    assert contents(str(tmp_path / "runs")) == "once\nagain\n"
    reader = batch.new_job()
    reader.command(f"cat {first.ofile}")
    with pytest.raises(hb.BatchException, match="files are not kept between runs"):
        batch.run()


def test_file_urls_and_a_dry_run(batch: Batch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not in the original: file:// URLs name local files too, as on the service; a dry run prints each job's
    script and runs nothing."""
    (tmp_path / "in.txt").write_text("abc")
    input = batch.read_input(f"file://{tmp_path}/in.txt")
    j = batch.new_job(name="copy")
    j.command(f"cat {input} > {j.ofile}")
    batch.write_output(j.ofile, f"file://{tmp_path}/out.txt")
    batch.run(dry_run=True)
    assert "# job 1 (copy)" in capsys.readouterr().out
    assert not (tmp_path / "out.txt").exists()
    again = Batch(backend=batch._backend)
    input = again.read_input(f"file://{tmp_path}/in.txt")
    k = again.new_job()
    k.command(f"cat {input} > {k.ofile}")
    again.write_output(k.ofile, f"file://{tmp_path}/out.txt")
    again.run()
    assert contents(str(tmp_path / "out.txt")) == "abc"


def test_always_copy_output(batch: Batch, tmp_path: Path) -> None:
    """Not in the original (hailtop.batch's LocalBackend refuses always_copy_output): a failed job's outputs are
    copied when it asks, those it wrote; one it did not write is no further error. Without it, none is."""
    j = batch.new_job()
    j.always_copy_output()
    j.command(f'echo "hello" > {j.ofile} && false && echo never > {j.never}')
    batch.write_output(j.ofile, str(tmp_path / "copied.txt"))
    batch.write_output(j.never, str(tmp_path / "never.txt"))
    k = batch.new_job()
    k.command(f'echo "hello" > {k.ofile} && false')
    batch.write_output(k.ofile, str(tmp_path / "not-copied.txt"))
    with pytest.raises(subprocess.CalledProcessError) as e:
        batch.run()
    assert e.value.returncode == 1
    assert contents(str(tmp_path / "copied.txt")) == "hello\n"
    assert not (tmp_path / "never.txt").exists() and not (tmp_path / "not-copied.txt").exists()
