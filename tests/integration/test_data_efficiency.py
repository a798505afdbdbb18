"""dsrecipes.data_efficiency as a library: pacing formulas, random-LTD layers, sampler, analyzer, config errors."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import Dataset

from dsrecipes.data_efficiency import (
    DataAnalyzer,
    load_metric_index,
)

# --------------------------------------------------------------------------- analyzer


def test_analyzer_metrics_files_and_parallel(tmp_path):
    rows = [[1, 1, 1, 2], [3, 4, 5, 6], [1, 2, 0, 0], [7, 7, 7, 7], [1, 1, 2, 2], [5, 6, 7, 1]]
    ds = Dataset.from_dict({"tokens": rows})
    ds.save_to_disk(str(tmp_path / "ds"))
    from datasets import load_from_disk

    disk = load_from_disk(str(tmp_path / "ds"))
    indexes = DataAnalyzer(disk, {"seqlen": None, "vocab_rarity": None, "maxtok": lambda t: t.max()},
                           pad_id=0).run()
    out_dir = indexes["seqlen"].directory
    assert out_dir.parent == (tmp_path / "ds") and out_dir.name == "data_analysis"  # next to the dataset
    np.testing.assert_array_equal(indexes["seqlen"].values, [4, 4, 2, 4, 4, 4])
    counts = np.bincount(np.asarray(rows).ravel()).astype(float)
    nlp = -np.log(np.maximum(counts, 1) / counts.sum())
    np.testing.assert_allclose(indexes["vocab_rarity"].values, [nlp[r].mean() for r in np.asarray(rows)], rtol=1e-12)
    np.testing.assert_array_equal(indexes["maxtok"].values, [2, 6, 2, 7, 2, 7])
    np.testing.assert_array_equal(indexes["maxtok"].order, [0, 2, 4, 1, 3, 5])  # stable: ties by sample id
    loaded = load_metric_index(out_dir, "vocab_rarity")
    np.testing.assert_array_equal(loaded.values, indexes["vocab_rarity"].values)
    np.testing.assert_array_equal(loaded.order, np.argsort(loaded.values, kind="stable"))
    assert (out_dir / "vocab_rarity.json").is_file()
    # parallel (num_proc=2) gives the same values
    par = DataAnalyzer(disk, ["vocab_rarity"], num_proc=2, batch_size=2, output_dir=tmp_path / "par").run()
    np.testing.assert_allclose(par["vocab_rarity"].values, indexes["vocab_rarity"].values, rtol=1e-12)
    with pytest.raises(ValueError, match="output_dir=None"):
        DataAnalyzer(ds, ["seqlen"])  # in memory: nowhere 'next to the dataset'
    with pytest.raises(ValueError, match="'perplexity' is not built in"):
        DataAnalyzer(disk, ["perplexity"])
    with pytest.raises(ValueError, match="run DataAnalyzer first"):
        load_metric_index(tmp_path, "seqlen")
