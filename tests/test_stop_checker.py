"""Stop strings on streamed text: cut before (or after) the stop string, across chunk boundaries,
never showing a partial stop string, and releasing held-back text when generation ends otherwise."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.engine.stop_checker import StopChecker


def stream(checker: StopChecker, chunks: list[str]) -> list[tuple[str, bool]]:
    return [(u.text, u.stopped) for u in (checker.append(c) for c in chunks)]


def test_stop_string_inside_one_chunk_cuts_the_text_before_it():
    checker = StopChecker(["STOP"])
    assert stream(checker, ["Hello ", "world STOP and more"]) == [("Hello ", False), ("world ", True)]
    assert checker.output_text == "Hello world "
    assert checker.matched == "STOP"


def test_stop_string_across_chunks_is_held_back_then_cut():
    checker = StopChecker(["STOP"])
    assert stream(checker, ["abc S", "T", "O", "P tail"]) == [("abc ", False), ("", False), ("", False), ("", True)]
    assert checker.output_text == "abc "


def test_held_back_text_is_released_when_it_stops_looking_like_a_stop_string():
    checker = StopChecker(["STOP"])
    assert stream(checker, ["abc ST", "x"]) == [("abc ", False), ("STx", False)]


def test_held_back_tail_is_released_at_finish_when_no_stop_string_completed():
    checker = StopChecker(["STOP"])
    assert stream(checker, ["abc ST"]) == [("abc ", False)]
    assert checker.flush() == "ST"
    assert checker.output_text == "abc ST"
    assert checker.matched is None


def test_include_stop_str_in_output_keeps_the_stop_string():
    checker = StopChecker(["</s>"], include_stop_str_in_output=True)
    assert stream(checker, ["answer</", "s> junk"]) == [("answer", False), ("</s>", True)]
    assert checker.output_text == "answer</s>"


def test_nothing_is_emitted_after_stopping():
    checker = StopChecker(["\n"])
    assert stream(checker, ["line one\nline two", "more"]) == [("line one", True), ("", True)]
    assert checker.flush() == ""
    assert checker.output_text == "line one"


def test_the_stop_string_that_completes_first_wins():
    # "bc" completes at index 3, before "abcd" does, whether the text arrives whole or char by char.
    whole = StopChecker(["abcd", "bc"])
    assert stream(whole, ["xabcd"]) == [("xa", True)]
    assert whole.matched == "bc"
    by_char = StopChecker(["abcd", "bc"])
    assert "".join(text for text, _ in stream(by_char, list("xabcd"))) == "xa"


def test_without_stop_strings_text_passes_straight_through():
    checker = StopChecker([])
    assert stream(checker, ["a", "bc"]) == [("a", False), ("bc", False)]


def expected_output(text: str, stops: list[str], include: bool) -> str:
    """Reference: cut where the first-completing stop string ends (earliest end, then earliest start)."""
    hits = [(text.index(s) + len(s), text.index(s), s) for s in stops if s in text]
    if not hits:
        return text
    end, start, _ = min(hits)
    return text[:end] if include else text[:start]


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab\n", max_size=30),
    stops=st.lists(st.text(alphabet="ab\n", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=10),
    include=st.booleans(),
)
def test_any_chunking_emits_exactly_the_cut_text_and_never_a_partial_stop_string(text, stops, cuts, include):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    expected = expected_output(text, stops, include)
    checker = StopChecker(stops, include_stop_str_in_output=include)
    emitted = ""
    for chunk in chunks:
        update = checker.append(chunk)
        emitted += update.text
        # Everything shown so far belongs to the final output: no partial stop string ever escapes.
        assert expected.startswith(emitted)
        if update.stopped:
            break
    emitted += checker.flush()
    assert emitted == expected == checker.output_text
