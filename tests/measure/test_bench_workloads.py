"""The bench's workload specs: what a user's ``--workload`` names, and the clear error
for one that names no path. (A ``novel=PATH`` whose transcripts hold no usable request
falls back to the library's docstrings and names that source in the report:
tests/measure/test_bench.py::test_novel_workload_names_the_source_it_used.)"""

import pytest

from assistd.ground.errors import InputError
from assistd.measure.bench_workloads import parse_spec


@pytest.mark.parametrize("spec", ["agent=", "edit=", "novel= "])
def test_a_name_with_an_empty_path_is_an_error_not_the_current_folder(spec):
    """``agent=`` once read as ``agent=.`` (Path("") is the current folder)."""
    with pytest.raises(InputError, match="no path after '='"):
        parse_spec(spec)

