"""An attempt's isolation note ("ran as:" in `corral job`) is cut at a word, never inside one (issue 36)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.driver.worker_events import MAX_ISOLATION_CHARS, cut_at_word

NOTE = ("process runtime: no container isolated this job: the image 'busybox' was ignored and the command ran "
        "with the worker machine's own programs. It ran as a user of its own (not root, no capabilities, no other "
        "running job shares it) in namespaces of its own: it saw only its own processes, its own working directory "
        "and private /tmp, /var/tmp and /dev/shm, none of the worker's files, and the rest of the host's files as "
        "any unprivileged user does; network: the host's, shared with the worker and other jobs. Shared with the "
        "host: the kernel. No cpu limit; at most 64 processes and threads.")


def test_the_process_runtimes_note_ends_on_a_whole_word() -> None:
    cut = cut_at_word(NOTE, MAX_ISOLATION_CHARS)
    assert len(cut) <= MAX_ISOLATION_CHARS and cut.endswith(" ...")
    kept = cut.removesuffix(" ...")
    assert NOTE.startswith(kept) and NOTE[len(kept)] in " ,;:"


@given(st.lists(st.text(alphabet="abc,", min_size=1, max_size=12), max_size=80).map(" ".join),
       st.integers(min_value=8, max_value=200))
def test_a_cut_is_a_prefix_ending_at_a_word(text: str, max_chars: int) -> None:
    cut = cut_at_word(text, max_chars)
    assert len(cut) <= max_chars
    if cut == text:
        return
    kept = cut.removesuffix(" ...")
    assert cut.endswith(" ...") and text.startswith(kept)
    rest = text[len(kept):]
    assert rest[:1] in (" ", ",") or " " not in text[:max_chars - 4]  # one word longer than the room: cut inside
