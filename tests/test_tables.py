"""Tables: real files from the corpus and synthetic frames; every conversion matches pandas' own values."""
import json

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.errors import DataprepError
from dataprep.pack.backends import read_manifest
from dataprep.serve.loader import Loader
from dataprep.tables.build import build_table
from dataprep.tables.columns import TableSettings
from dataprep.tables.dataset import TabularDataset

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
    X, codes, mask, y = ds[list(range(6))]  # a --missing mask pack serves its mask
    assert codes[:, 0].tolist() == [3, 1, 3, 0, 2, 1] and y.tolist() == [1, 0, 1, 0, 0, 1]  # "no" < "yes"
    assert np.array_equal(mask.numpy(), ds.arrays["mask"])
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
    X2, _, y2 = TabularDataset(tmp_path / "b", categorical="features")[[0, 1]]
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


# -- what a user trips over in the first week ---------------------------------------------------------
@pytest.fixture
def masked_dated(tmp_path):
    """24 rows: x encodes the row, v misses every 5th value, a city, a date per row, a class."""
    n = 24
    days = pd.date_range("2021-01-01", periods=n, freq="37h")
    df = pd.DataFrame({"x": np.arange(n) + 0.5, "v": [np.nan if k % 5 == 0 else k * 2.0 for k in range(n)],
                       "city": [["oslo", "lima", "rome"][k % 3] for k in range(n)],
                       "when": days.strftime("%Y-%m-%d %H:%M:%S"), "y": np.arange(n) % 2})
    p = tmp_path / "md.csv"
    df.to_csv(p, index=False)
    build_table([str(p)], tmp_path / "md", TableSettings(target="y", missing="mask", datetime="int64", dates=("when",)), {})
    seconds = (days - pd.Timestamp("1970-01-01")) // pd.Timedelta(seconds=1)
    return tmp_path / "md", df, np.asarray(seconds, np.int64)


def test_mask_and_datetimes_are_served_by_items_batches_and_the_loader(masked_dated):
    pack, df, seconds = masked_dated
    ds = TabularDataset(pack)
    n = len(df)
    assert ds.fields == ("features", "categorical", "mask", "datetimes", "target")
    miss = np.isnan(df["v"].to_numpy())
    X, codes, mask, when, y = ds[list(range(n))]
    assert ds.feature_columns == ["x", "v"] and X[:, 0].tolist() == (df["x"]).tolist()
    assert mask.dtype == torch.uint8 and mask.shape == (n, 2) and mask[:, 1].numpy().astype(bool).tolist() == miss.tolist()
    assert mask[:, 0].sum() == 0 and (X[:, 1].numpy()[miss] == 0).all()
    assert when.dtype == torch.int64 and when[:, 0].tolist() == seconds.tolist()
    assert codes[:, 0].tolist() == [ds.vocab["city"].index(c) for c in df["city"]] and y.tolist() == df["y"].tolist()
    for i in (0, 5, n - 1):  # one row: the same fields, one sample's shape
        row = ds[i]
        assert len(row) == 5 and all(torch.equal(a, b[i]) for a, b in zip(row, (X, codes, mask, when, y)))
    items = ds.__getitems__([3, 10, 15])
    assert len(items) == 3 and all(torch.equal(a, b[j]) for k, j in enumerate([3, 10, 15]) for a, b in zip(items[k], (X, codes, mask, when, y)))
    for workers in (0, 2):
        batches = list(Loader(ds, 8, num_workers=workers))
        assert all(len(b) == 5 for b in batches)
        for got, want in zip((torch.cat([b[k] for b in batches]) for k in range(5)), (X, codes, mask, when, y)):
            assert got.dtype == want.dtype and torch.equal(got, want)
    Xf, mf, wf, yf = TabularDataset(pack, categorical="features")[list(range(n))]  # codes appended to the features
    assert Xf.shape == (n, 3) and torch.equal(mf, mask) and torch.equal(wf, when) and torch.equal(yf, y)
    Xn, mn, wn, yn = next(iter(Loader(TabularDataset(pack, categorical="none"), n, num_workers=0)))
    assert torch.equal(Xn, X) and torch.equal(mn, mask) and torch.equal(wn, when) and torch.equal(yn, y)


def test_a_slice_is_the_batch_of_its_indices(masked_dated):
    pack, _, _ = masked_dated
    ds = TabularDataset(pack)
    n = len(ds)
    for sl in (slice(0, 4), slice(None, None, -3), slice(-5, None), slice(3, 20, 4), slice(7, 2), slice(-100, 100)):
        got, want = ds[sl], ds[list(range(n))[sl]]
        assert len(got) == len(want) == 5 and all(torch.equal(a, b) for a, b in zip(got, want))
        assert got[0].shape[0] == len(range(n)[sl])
    assert ds[1:3][0][:, 0].tolist() == [1.5, 2.5]


def _every(ds):
    """Every row as one batch (a list of indices: this runs on datasets that take no slices too)."""
    return ds[list(range(len(ds)))]


def test_rows_with_a_missing_target_can_be_dropped_and_are_counted(tmp_path):
    n = 30
    lost = [2, 11, 17]
    df = pd.DataFrame({"x": np.arange(n) + 0.25, "y": [np.nan if k in lost else float(k % 3) for k in range(n)]})
    p = tmp_path / "t.csv"
    df.to_csv(p, index=False)
    with pytest.raises(DataprepError, match=r"column 'y' \(the target\) has 3 missing values.*--drop-missing-target"):
        build_table([str(p)], tmp_path / "a", TableSettings(target="y"), {})
    r = cli("table", p, "--target", "y", "--task", "classification", "--out", tmp_path / "b")
    assert r.exit_code == 1 and "--drop-missing-target" in r.output
    r = cli("table", p, "--target", "y", "--drop-missing-target", "--val-fraction", 0.2, "--out", tmp_path / "c")
    assert r.exit_code == 0, r.output
    assert "dropped 3 rows with a missing target" in r.output
    m = read_manifest(tmp_path / "c")
    assert m["rows"] == {"read": n, "dropped": {"missing target": len(lost)}} and m["settings"]["drop_missing_target"] is True
    assert m["fields"]["target"]["classes"] == [0, 1, 2]  # classes of integers, though pandas read floats around the gaps
    tr, va = TabularDataset(tmp_path / "c"), TabularDataset(tmp_path / "c", "val")
    assert len(tr) + len(va) == n - len(lost)
    xs = sorted(_every(tr)[0][:, 0].tolist() + _every(va)[0][:, 0].tolist())
    assert xs == [k + 0.25 for k in range(n) if k not in lost]
    assert all(int(y) == int(x) % 3 for x, y in zip(_every(tr)[0][:, 0].tolist(), _every(tr)[1].tolist()))


def _id_table(tmp_path, n=40):
    rng = np.random.default_rng(5)
    df = pd.DataFrame({"user": [f"u{k:05d}" for k in rng.permutation(n)], "order": 1000 + 7 * rng.permutation(n),
                       "day": [f"2022-03-{1 + k % 12:02d}" for k in range(n)], "city": [["oslo", "lima", "rome"][k % 3] for k in range(n)],
                       "count": np.arange(n) % 4, "x": np.arange(n) * 0.5, "y": np.arange(n) % 2})
    p = tmp_path / f"ids{n}.csv"
    df.to_csv(p, index=False)
    return df, p


def test_ids_are_excluded_and_date_strings_are_named(tmp_path):
    df, p = _id_table(tmp_path)
    r = cli("table", p, "--target", "y", "--out", tmp_path / "a")
    assert r.exit_code == 0, r.output
    ds = TabularDataset(tmp_path / "a")
    assert "user" not in ds.categorical_columns and "order" not in ds.feature_columns
    assert ds.feature_columns == ["count", "x"] and ds.categorical_columns == ["day", "city"]
    lines = {ln.split(":", 1)[0].strip(): ln.split(":", 1)[1] for ln in r.output.splitlines() if ln.startswith("    ")}
    assert set(lines) == set(df.columns)  # every column's chosen type
    assert "excluded" in lines["user"] and "40 distinct values in 40 rows" in lines["user"] and "--keep-ids" in lines["user"]
    assert "excluded" in lines["order"] and "--keep-ids" in lines["order"]
    assert "categorical with 12 values" in lines["day"] and "--dates day" in lines["day"]
    assert "categorical with 3 values" in lines["city"] and "dates" not in lines["city"]
    assert "feature float32" in lines["x"] and "feature float32" in lines["count"] and "target" in lines["y"]
    conv = read_manifest(tmp_path / "a")["fields"]["conversions"]
    assert conv["user"].startswith("excluded") and "--dates day" in conv["day"]
    r = cli("table", p, "--target", "y", "--keep-ids", "--dates", "day", "--out", tmp_path / "b")
    assert r.exit_code == 0, r.output
    ds = TabularDataset(tmp_path / "b")
    assert ds.categorical_columns == ["user", "city"] and len(ds.vocab["user"]) == 40
    assert ds.feature_columns[0] == "order" and _every(ds)[0][:, 0].tolist() == df["order"].astype(float).tolist()
    assert "day.month" in ds.feature_columns and "datetime" in read_manifest(tmp_path / "b")["fields"]["conversions"]["day"]
    _, ps = _id_table(tmp_path, n=8)  # a handful of rows: distinct values are no evidence of an ID
    build_table([str(ps)], tmp_path / "c", TableSettings(target="y"), {})
    assert "user" in TabularDataset(tmp_path / "c").categorical_columns


def test_info_shows_columns_vocabularies_missing_policy_and_dropped_rows(mixed, tmp_path):
    df = mixed[0].assign(label=[None, "no", "yes", "no", "no", "yes"])
    df.to_csv(tmp_path / "m.csv", index=False)
    r = cli("table", tmp_path / "m.csv", "--target", "label", "--missing", "mask", "--dates", "joined",
            "--drop-missing-target", "--out", tmp_path / "p")
    assert r.exit_code == 0, r.output
    r = cli("info", tmp_path / "p")
    assert r.exit_code == 0, r.output
    out = r.output
    assert "missing:   mask" in out and "dropped 1 row with a missing target" in out
    assert "features (float32)" in out and "<f4" not in out and "|u1" not in out  # dtypes by name
    lines = {ln.split(":", 1)[0].strip(): ln for ln in out.splitlines() if ln.startswith("  ") and ":" in ln}
    assert "feature float32" in lines["age"] and "1 missing" in lines["age"]
    assert "categorical with 4 values (<missing>, lima, oslo, paris)" in lines["city"]  # row 0 (dropped) was not its only paris
    assert "datetime" in lines["joined"] and "target" in lines["label"] and "classification" in lines["label"]
    r = cli("table", tmp_path / "m.csv", "--target", "label", "--missing", "mean", "--drop", "joined",
            "--drop-missing-target", "--out", tmp_path / "q")
    out = cli("info", tmp_path / "q").output
    assert "missing:   mean" in out and "excluded" in out and "joined" in out


def _statistics_over_all_rows(monkeypatch):
    """Wrong implementation (negative control): statistics and the imputed mean over every row, val included."""
    from dataprep.tables import columns

    stats, fill = columns._statistics, columns._fill
    monkeypatch.setattr(columns, "_statistics", lambda arrays, f, train_rows: stats(arrays, f, np.ones_like(train_rows)))
    monkeypatch.setattr(columns, "_fill", lambda v, name, s, train_rows: fill(v, name, s, np.ones_like(train_rows)))


@pytest.mark.parametrize("impl", ["train_rows", "all_rows"])
def test_train_statistics_and_imputation_ignore_the_val_split(tmp_path, monkeypatch, impl):
    """With --val-fraction, the manifest's mean, std, min and max and the mean filled in for missing values (in
    both splits) come from the train rows only: two val rows holding 1e6 and -5e5 move none of them. Each of
    these checks fails on its own when the statistics are taken over every row (the negative control)."""
    if impl == "all_rows":
        _statistics_over_all_rows(monkeypatch)
    n = 40
    v = np.array([np.nan if k % 6 == 0 else float(k * k) for k in range(n)])
    df = pd.DataFrame({"x": np.arange(n) + 0.5, "v": v, "y": np.arange(n) % 2})
    settings = dict(target="y", val_fraction=0.4, seed=2)

    def split_rows(pack):  # x = row + 0.5: which rows each split holds
        return {name: (_every(TabularDataset(pack, name))[0][:, 0].numpy() - 0.5).astype(int) for name in ("train", "val")}

    # the split depends on the seed and the row count only: a first build shows which rows are val
    df.to_csv(tmp_path / "probe.csv", index=False)
    build_table([str(tmp_path / "probe.csv")], tmp_path / "probe", TableSettings(missing="mean", **settings), {})
    val_known = [r for r in split_rows(tmp_path / "probe")["val"] if not np.isnan(v[r])]
    v[val_known[0]], v[val_known[1]] = 1e6, -5e5
    df["v"] = v
    df.to_csv(tmp_path / "t.csv", index=False)
    for missing in ("mean", "mask"):
        pack = tmp_path / missing
        build_table([str(tmp_path / "t.csv")], pack, TableSettings(missing=missing, **settings), {})
        rows = split_rows(pack)
        assert len(rows["val"]) == 16 and sorted(np.concatenate(list(rows.values())).tolist()) == list(range(n))
        assert {k: r.tolist() for k, r in rows.items()} == {k: r.tolist() for k, r in split_rows(tmp_path / "probe").items()}
        train_v = v[rows["train"]]
        train_mean = float(np.nanmean(train_v))
        assert abs(train_mean - np.nanmean(v)) > 1e4  # the val rows would move the mean a long way if they counted
        # what the train rows hold: mean policy, the train mean in place of each missing value; mask policy, known values only
        held = np.where(np.isnan(train_v), np.float32(train_mean), train_v) if missing == "mean" else train_v[~np.isnan(train_v)]
        st = read_manifest(pack)["stats"]["features"]
        checks = {"mean": st["v"]["mean"] == pytest.approx(held.mean()), "std": st["v"]["std"] == pytest.approx(held.std()),
                  "max": st["v"]["max"] == np.nanmax(train_v), "min": st["v"]["min"] == np.nanmin(train_v),
                  "x mean": st["x"]["mean"] == pytest.approx(rows["train"].mean() + 0.5)}
        if missing == "mean":
            for name, r in rows.items():
                filled = _every(TabularDataset(pack, name))[0][:, 1].numpy()[np.isnan(v[r])]
                assert len(filled) > 0
                checks[f"{name} fill"] = bool(np.all(filled == np.float32(train_mean)))
        assert len(checks) == (7 if missing == "mean" else 5)
        if impl == "train_rows":
            assert all(checks.values()), (missing, checks)
        else:  # negative control: every check catches statistics taken over all rows
            assert not any(checks.values()), (missing, checks)


@pytest.mark.parametrize("float_dtype", ["float16", "float64"])
def test_missing_value_fill_and_float_dtype_are_what_is_stored(tmp_path, float_dtype):
    """--missing value puts the given number exactly where values were missing (and nowhere else);
    --float-dtype is the features' (and a regression target's) stored and served dtype."""
    df = pd.DataFrame({"a": [1.5, None, 3.25, None, 5.0, 6.0], "b": [0.5, 1.0, None, 2.0, 2.5, 3.0],
                       "y": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]})
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    build_table([str(path)], tmp_path / "p", TableSettings(target="y", missing="value", fill_value=-7.0,
                                                           float_dtype=float_dtype), {})
    ds = TabularDataset(tmp_path / "p")
    feats, target = ds[list(range(len(ds)))][:1] + ds[list(range(len(ds)))][-1:]
    assert feats.dtype == getattr(torch, float_dtype) and target.dtype == getattr(torch, float_dtype)
    expect = df[["a", "b"]].fillna(-7.0).to_numpy()
    assert np.array_equal(feats.double().numpy(), expect.astype(float_dtype).astype(np.float64))
    assert np.allclose(target.double().numpy(), df["y"].to_numpy(), atol=1e-3)
