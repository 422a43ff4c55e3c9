"""The project describes the software, not how it was made: no file in the repository counts the rounds of work
that built it ("the twelfth session", "this session's code", "in the eleventh's read"). A record names a date and
a commit instead (docs/LOG.md, docs/RESULTS.md). Words a sentence breaks over two lines, or over two comment
lines, are read as one sentence."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".j2", ".json", ""}
ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth"
    r"|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth)"
)
ROUND_OF_WORK = re.compile(
    rf"\b{ORDINAL}[- ](?:session|round of work|wave)s?\b"
    r"|\b(?:this|that|each|every|a|the|next|previous|earlier|later|last|other|another|same|one)\s+(?:session|wave)"
    r"(?:s|'s)?\b"
    rf"|\b(?:the|a)\s+(?:fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth)'s\b",
    re.IGNORECASE,
)
# A line break, and the comment marker or indentation that continues the sentence on the next line.
LINE_BREAK = re.compile(r"[ \t]*\n[ \t]*(?:#+[ \t]*|//[ \t]*)?")


def talk_of_rounds(text: str) -> list[str]:
    return [m.group(0) for m in ROUND_OF_WORK.finditer(LINE_BREAK.sub(" ", text))]


def test_no_file_talks_of_the_rounds_of_work_that_made_it():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = {}
    for name in tracked.split("\n"):
        path = ROOT / name
        if name and path.suffix in TEXT_SUFFIXES and path.is_file() and path != Path(__file__).resolve():
            try:
                hits = talk_of_rounds(path.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                continue
            if hits:
                found[name] = hits
    assert found == {}


def test_the_check_reads_a_sentence_across_lines_and_leaves_process_sessions_alone():
    assert talk_of_rounds("measured in the thirteenth\n    # session on 2 cores") == ["thirteenth session"]
    assert talk_of_rounds("This session's code") == ["This session's"]
    assert talk_of_rounds("as the eleventh's read showed") == ["the eleventh's"]
    assert talk_of_rounds('@pytest.fixture(scope="session")\nstart_new_session=True, a test session fixture') == []
    assert talk_of_rounds("the second seed, the third read of the split") == []
