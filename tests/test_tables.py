"""Tables: real files from the corpus and synthetic frames; every conversion matches pandas' own values."""
import json
import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.tables.dataset import TabularDataset
from dataprep.errors import DataprepError
from dataprep.serve.loader import Loader
from dataprep.pack.backends import read_manifest
from dataprep.tables.build import build_table
from dataprep.tables.columns import TableSettings

from .conftest import corpus_dir


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.corpus
@pytest.mark.parametrize(
    "name, args, rows, feats",
    [
        ("iris.csv", ["--header", "none", "--skip-rows", "1", "--target", "-1"], 150, 4),
        ("breast_cancer.csv", ["--header", "none", "--skip-rows", "1", "--target", "-1"], 569, 30),
        ("wine_data.csv", ["--header", "none", "--skip-rows", "1", "--target", "-1"], 178, 13),
        ("digits.csv.gz", ["--header", "none", "--target", "-1"], 1797, 64),
        ("linnerud_exercise.csv", ["--sep", "space", "--target", "Jumps", "--task", "regression"], 20, 2),
    ],
)
def test_real_tables_match_pandas(tmp_path, name, args, rows, feats):
    path = corpus_dir("tables") / name
    r = cli("table", path, "--out", tmp_path / "p", *args)
    assert r.exit_code == 0, r.output
    ds = TabularDataset(tmp_path / "p")
    assert len(ds) == rows and len(ds.feature_columns) == feats
    header = "infer" if "--sep" in args else None
    skip = 1 if "--skip-rows" in args else 0
    df = pd.read_csv(path, header=None if header is None else "infer", skiprows=skip or None,
                     sep=r"\s+" if "--sep" in args else ",")
    X, y = ds[list(range(rows))]
    target = df.columns[-1] if "-1" in args else "Jumps"
    expect = df.drop(columns=[target]).to_numpy(np.float64).astype(np.float32)
    assert X.dtype == torch.float32 and np.array_equal(X.numpy(), expect)
    assert np.allclose(y.numpy(), df[target].to_numpy(np.float64))


@pytest.mark.corpus
def test_diabetes_with_its_target_in_another_file(tmp_path):
    t = corpus_dir("tables")
    r = cli("table", t / "diabetes_data_raw.csv.gz", "--header", "none", "--sep", "space", "--target", "y",
            "--target-file", t / "diabetes_target.csv.gz", "--out", tmp_path / "p", "--val-fraction", "0.25", "--seed", "3")
    assert r.exit_code == 0, r.output
    tr, va = TabularDataset(tmp_path / "p"), TabularDataset(tmp_path / "p", "val")
    assert len(tr) + len(va) == 442 and len(va) == 110
    assert tr.target_info["task"] == "regression" and tr[0][1].dtype == torch.float32
    raw = pd.read_csv(t / "diabetes_target.csv.gz", header=None).iloc[:, 0].to_numpy()
    got = np.sort(np.concatenate([tr[list(range(len(tr)))][1].numpy(), va[list(range(len(va)))][1].numpy()]))
    assert np.allclose(got, np.sort(raw.astype(np.float32)))


@pytest.fixture
def mixed(tmp_path):
    df = pd.DataFrame({
        "age": [30, 41, None, 25, 52, 38],
        "income": [1.5, 2.5, 3.0, None, 4.0, 2.0],
        "city": ["paris", "lima", "paris", None, "oslo", "lima"],
        "member": [True, False, True, True, False, False],
        "joined": pd.to_datetime(["2020-01-05", "2021-03-01", "2019-12-31", "2022-07-04", "2020-02-29", "2023-11-11"]),
        "label": ["yes", "no", "yes", "no", "no", "yes"],
    })
    p = tmp_path / "mixed.csv.gz"
    df.to_csv(p, index=False)
    return df, p


def test_column_types_and_policies(mixed, tmp_path):
    df, path = mixed
    with pytest.raises(DataprepError, match="column 'age' has 1 missing values"):
        build_table([str(path)], tmp_path / "a", TableSettings(target="label"), {})
    s = TableSettings(target="label", missing="mask", categorical=("city",), dates=("joined",))
    build_table([str(path)], tmp_path / "b", s, {})
    ds = TabularDataset(tmp_path / "b")
    m = read_manifest(tmp_path / "b")
    assert ds.feature_columns[:2] == ["age", "income"] and "member" in ds.feature_columns
    assert ds.vocab["city"] == ["<missing>", "lima", "oslo", "paris"]
    X, codes, y = ds[list(range(6))]
    assert codes[:, 0].tolist() == [3, 1, 3, 0, 2, 1] and y.tolist() == [1, 0, 1, 0, 0, 1]  # "no" < "yes"
    mask = ds.arrays["mask"]
    assert mask[2, 0] == 1 and X[2, 0] == 0 and mask[3, 1] == 1 and mask.sum() == 2
    assert X[:, ds.feature_columns.index("member")].tolist() == [1, 0, 1, 1, 0, 0]
    assert X[:, ds.feature_columns.index("joined.year")].tolist() == [2020, 2021, 2019, 2022, 2020, 2023]
    assert m["stats"]["features"]["age"]["mean"] == pytest.approx(np.nanmean(df["age"]))  # masked values not counted
    vocab = json.loads((tmp_path / "b" / "vocab.json").read_text())  # beside the manifest, not in it
    assert vocab["city"] == {"values": ["<missing>", "lima", "oslo", "paris"], "train_counts": [1, 2, 1, 2]}
    assert m["stats"]["categorical"]["city"] == {"values": 4, "train_rows": 6} and "vocab" not in m["fields"]["categorical"]
    build_table([str(path)], tmp_path / "c", TableSettings(target="label", missing="mean", drop=("city", "joined")), {})
    X, y = TabularDataset(tmp_path / "c")[list(range(6))]
    assert X[2, 0] == pytest.approx(np.nanmean(df["age"]))
    X2, y2 = TabularDataset(tmp_path / "b", categorical="features")[[0, 1]]
    assert X2.shape == (2, len(ds.feature_columns) + 1)


def test_split_by_column_and_loader(tmp_path):
    df = pd.DataFrame({"x": np.arange(40, dtype=float), "y": np.arange(40) % 3, "part": ["train"] * 30 + ["test"] * 10})
    p = tmp_path / "t.csv"
    df.to_csv(p, index=False)
    build_table([str(p)], tmp_path / "p", TableSettings(target="y", split_column="part"), {})
    tr, te = TabularDataset(tmp_path / "p"), TabularDataset(tmp_path / "p", "test")
    assert len(tr) == 30 and len(te) == 10 and te[0][0].item() == 30.0
    batches = list(Loader(tr, 8, shuffle=True, seed=1, num_workers=2))
    xs = torch.cat([b[0][:, 0] for b in batches])
    ys = torch.cat([b[1] for b in batches])
    assert sorted(xs.tolist()) == [float(i) for i in range(30)] and torch.equal(ys, (xs.long() % 3))


def test_bad_input(tmp_path, mixed):
    _, path = mixed
    r = cli("table", path, "--target", "price", "--out", tmp_path / "a")
    assert r.exit_code == 1 and "no column 'price'" in r.output
    r = cli("table", path, "--target", "label", "--numeric", "city", "--missing", "value", "--out", tmp_path / "b")
    assert r.exit_code == 1 and "column 'city' cannot be converted to numbers" in r.output
    empty = tmp_path / "empty.csv"
    empty.write_text("a,b\n")
    r = cli("table", empty, "--target", "b", "--out", tmp_path / "c")
    assert r.exit_code == 1 and "empty" in r.output
    r = cli("table", tmp_path / "nope.csv", "--target", "b", "--out", tmp_path / "d")
    assert r.exit_code == 1 and "nope.csv: no such file" in r.output
    big = tmp_path / "big.csv"
    big.write_text("a,y\n1e300,1\n2,0\n")
    r = cli("table", big, "--target", "y", "--out", tmp_path / "e")
    assert r.exit_code == 1 and "column 'a' does not fit in float32" in r.output


def test_parquet_input(tmp_path):
    df = pd.DataFrame({"a": [1.5, 2.5, 3.5], "kind": ["x", "y", "x"], "y": [0, 1, 0]})
    df.to_parquet(tmp_path / "t.parquet")
    build_table([str(tmp_path / "t.parquet")], tmp_path / "p", TableSettings(target="y"), {})
    X, codes, y = TabularDataset(tmp_path / "p")[[0, 1, 2]]
    assert X[:, 0].tolist() == [1.5, 2.5, 3.5] and codes[:, 0].tolist() == [0, 1, 0] and y.tolist() == [0, 1, 0]
