"""The regression check must fail, readably, on any changed counter."""
import shutil

import pandas as pd

from dllm_bench import regression


def test_committed_tables_cover_every_config():
    t = regression.load_tables()
    assert set(t["systems"]["config"]) == {c[0] for c in regression.CONFIGS + regression.SIMILAR_CONFIGS}
    assert len(t["requests"]) == 5 * len(regression.CONFIGS) + 2 * len(regression.SIMILAR_CONFIGS)
    # the default preset's slice pins the counters the headline numbers are made of, per system
    sim = t["systems"].set_index("config").loc[[c[0] for c in regression.SIMILAR_CONFIGS]]
    for col in ("logits_rows", "query_tokens", "refresh_steps", "reuse_steps"):
        assert (sim[col].astype(int) > 0).all(), col


def test_check_fails_on_altered_counter(tmp_path, monkeypatch, capsys):
    shutil.copytree(regression.TABLE_DIR, tmp_path / "t")
    committed = regression.load_tables()
    monkeypatch.setattr(regression, "TABLE_DIR", tmp_path / "t")
    monkeypatch.setattr(regression, "generate_tables", lambda: {k: v.copy() for k, v in committed.items()})
    assert regression.main(["check"]) == 0

    altered = regression.load_tables(tmp_path / "t")
    altered["systems"].loc[2, "forwards"] = str(int(altered["systems"].loc[2, "forwards"]) + 1)
    altered["requests"].loc[0, "tokens"] = "0" * 16
    regression.write_tables(altered, tmp_path / "t")
    assert regression.main(["check"]) == 1
    err = capsys.readouterr().err
    cfg = committed["systems"].loc[2, "config"]
    assert f"('{cfg}',) forwards" in err or f"{cfg} forwards" in err or cfg in err
    assert "tokens" in err and "2 counter(s) differ" in err


def test_diff_reports_added_and_removed_rows():
    t = regression.load_tables()
    fewer = {k: v.iloc[1:].copy() for k, v in t.items()}
    lines = regression.diff_tables(t, fewer)
    assert any("removed" in line for line in lines)
    lines = regression.diff_tables(fewer, t)
    assert any("added" in line for line in lines)
    assert regression.diff_tables(t, {k: pd.DataFrame(v) for k, v in t.items()}) == []
