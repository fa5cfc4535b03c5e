"""The bench's workload specs: what a user's ``--workload`` names, and the clear error
for one that names nothing usable (no silent fallback to another source)."""

import pytest

from assistd.ground.errors import InputError
from assistd.measure.bench_workloads import novel_workload, parse_spec


@pytest.mark.parametrize("spec", ["agent=", "edit=", "novel= "])
def test_a_name_with_an_empty_path_is_an_error_not_the_current_folder(spec):
    """``agent=`` once read as ``agent=.`` (Path("") is the current folder)."""
    with pytest.raises(InputError, match="no path after '='"):
        parse_spec(spec)


def test_novel_from_a_folder_without_requests_says_so(tmp_path):
    """``novel=EMPTY_FOLDER`` once fell back to the library's docstrings without a word;
    the transcripts the user named hold no request, and the error says where."""
    (tmp_path / "notes.txt").write_text("short\n")
    with pytest.raises(InputError, match=r"novel: no first user message.*" + tmp_path.name):
        novel_workload(None, tmp_path, n_cases=2, budget=256)
