"""`serve --endpoint` alone (no --systems) runs no system of its own: a flag that shapes only those
(serve.run.LOCAL_ONLY) is refused before the endpoint is asked anything, not recorded without effect."""
from __future__ import annotations

import pytest

URL = "http://127.0.0.1:9/v1"   # never reached: the refusal comes first


@pytest.mark.parametrize("args, flag", [
    (["--trace-steps"], "--trace-steps"),
    (["--no-cuda-graphs"], "--[no-]cuda-graphs"),
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size"),
    (["--no-profile-cache"], "--no-profile-cache"),
    (["--max-num-seqs", "4"], "--max-num-seqs"),
    (["--retention", "0.5"], "--retention"),
    (["--baseline-batch", "upstream"], "--baseline-batch"),
])
def test_a_flag_for_local_systems_with_the_endpoint_alone(refused, tmp_path, args, flag):
    msg = refused("serve", "--preset", "tiny", "--endpoint", URL, *args, "--result-dir", str(tmp_path / "runs"))
    assert msg.startswith(f"error: {flag} applies to the systems serve runs itself")
