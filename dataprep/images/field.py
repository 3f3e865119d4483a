"""The image field: both directions of images, masks and volumes in a pack (JPEG bytes or raw pixels, fixed
shape or a blob plus offsets, every sample's shape), and how the field describes itself in the manifest;
and the fields of an image pack (`fields_of`) and those a dataset serves at one resolution (`served_fields`).

Segmentation masks and volumes are pixels too: their kinds store them through `ImageField` with their
own role (each role's arrays have their own names, so they sit beside images in one split)."""
from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import PackError
from ..pack.arrays import BYTES, OFFSETS, SHAPES, LoadContext, blob_arrays, blob_shapes, load_blob, load_rows, rows_shape
from ..pack.fields import Field, IdsField, LabelField, RowsField, StringsField
from .jpegseg import jpeg_problem
from .settings import over_caps

# What each role's arrays are called: the generic keys a field's `load` returns (its stored names add the
# field's suffix). Distinct per role, so one split's fields load into one flat dict.
ROLE_ARRAYS = {
    "image": ("images", "offsets", "shapes"),
    "mask": ("masks", "mask_offsets", "mask_shapes"),
    "volume": ("volumes", "volume_offsets", "volume_shapes"),
    "volume_mask": ("volume_masks", "volume_mask_offsets", "volume_mask_shapes"),  # label volumes beside volumes
}


PIXEL_DTYPES = ("|u1", "<u2")


@dataclass(frozen=True)
class ImageField:
    """Images (or masks, or volumes), stored as JPEG bytes (`jpeg`) or decoded pixels (`raw`, uint8 or
    little-endian uint16); samples of one fixed shape are one (N, *shape) array, anything else a blob of
    bytes plus byte offsets, with every sample's shape, three ints ((H, W, C), or (D, H, W) for
    volumes), in `shapes`."""

    encoding: str  # "jpeg" | "raw"
    shape: tuple[int, int, int] | None  # fixed shape of raw samples, else None
    channels: int | None  # 1 or 3; None for volumes (no channel axis)
    suffix: str = ""  # array-name suffix of one resolution of a multi-resolution pack ("_r128")
    dtype: str = "|u1"
    role: str = "image"

    def name(self, key: str) -> str:
        """The stored array name of generic key `key` (one of this role's ROLE_ARRAYS)."""
        return key + self.suffix

    @property
    def keys(self) -> tuple[str, str, str]:
        """Generic keys: (data, offsets, shapes)."""
        return ROLE_ARRAYS[self.role]

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def fixed(self) -> bool:
        return self.encoding == "raw" and self.shape is not None

    def to_manifest(self) -> dict[str, Any]:
        data, offs, shapes = self.keys
        return {
            "role": self.role,
            "encoding": self.encoding,
            "layout": "fixed" if self.fixed else "blob",
            "dtype": self.dtype,
            "shape": list(self.shape) if self.fixed else [None, None, self.channels],
            "channels": self.channels,
            "suffix": self.suffix,
            "arrays": [self.name(a) for a in ([data, shapes] if self.fixed else [data, offs, shapes])],
        }

    @classmethod
    def from_manifest(cls, spec: dict[str, Any], where: Path) -> "ImageField":
        try:
            enc, role = spec["encoding"], str(spec.get("role", "image"))
            channels = None if spec["channels"] is None else int(spec["channels"])
            shape = tuple(int(x) for x in spec["shape"]) if spec["layout"] == "fixed" else None
            suffix, dtype = str(spec.get("suffix", "")), str(spec.get("dtype", "|u1"))
        except (KeyError, TypeError, ValueError) as e:
            raise PackError(f"{where}: malformed image field description ({e})") from None
        if (enc not in ("jpeg", "raw") or role not in ROLE_ARRAYS or dtype not in PIXEL_DTYPES
                or channels not in ((None,) if role.startswith("volume") else (1, 3))
                or (suffix and not re.fullmatch(r"_r\d+", suffix)) or (enc == "jpeg" and dtype != "|u1")):
            raise PackError(f"{where}: unknown {role} field: encoding {enc!r}, dtype {dtype!r}, channel count "
                            f"{channels} or suffix {suffix!r}")
        return cls(enc, shape, channels, suffix, dtype, role)

    def stored(self) -> dict[str, str]:
        data, offs, shapes = self.keys
        return {self.name(k): k for k in ([data, shapes] if self.fixed else [data, offs, shapes])}

    def count(self, arrays: dict[str, Any]) -> int:
        return len(arrays[self.keys[2]])

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        return []  # `load` checks shapes, channels and sizes; `decode_check` the JPEG bytes

    def decode_check(self, arrays: dict[str, Any]) -> list[tuple[int, str]] | None:
        """Decode every stored JPEG along the paths the datasets serve it by (verify --decode): (sample, what is
        wrong) for each that they refuse from its frame header (jpegseg.jpeg_problem), that does not decode or
        decodes to another shape than the recorded one, or whose restart segments, cut as a training crop cuts
        them, decode to other pixels than the whole image (codec.region_problem); None when the field stores no
        encoded data."""
        if self.encoding != "jpeg":
            return None
        from .codec import decode_cv2, region_problem
        from .jpegseg import jpeg_problem

        data, offs, shp_key = self.keys
        blob, offsets, shapes = arrays[data], arrays[offs], arrays[shp_key]
        name = f"{self.name(data)}.npy"
        out = []
        for k in range(len(offsets) - 1):
            buf = blob[offsets[k] : offsets[k + 1]]
            h, w = int(shapes[k][0]), int(shapes[k][1])
            why = jpeg_problem(buf, h, w)
            if why is not None:
                out.append((k, f"{name}: holds {why}, not the {w}x{h} JPEG its shape says (every serving path refuses it)"))
                continue
            img = decode_cv2(buf, self.channels)
            if img is None:
                out.append((k, f"{name}: does not decode"))
            elif tuple(img.shape) != tuple(shapes[k]):
                out.append((k, f"{name}: decodes to {img.shape}, its shape says {tuple(int(v) for v in shapes[k])}"))
            elif (why := region_problem(buf, h, w, self.channels)) is not None:
                out.append((k, f"{name}: {why}"))
        return out

    def pixels(self, stored, shape, manifest: dict[str, Any], what: str) -> np.ndarray:
        """A stored sample as pixels (HWC), a JPEG decoded as the datasets decode it once every serving path
        would (`jpeg_refusal`, from its header: nothing is decoded first).

        Args:
            stored: the sample as `sample` gives it (or a copy): pixels, or JPEG bytes.
            shape: the sample's recorded shape (its row of the shapes array).
            manifest: the pack's manifest, whose settings give the caps at this field's resolution.
            what: the pack, split and sample, for the error.

        Returns:
            The pixels; a PackError naming `what` where the JPEG is refused or does not decode.
        """
        if self.encoding == "raw":
            return np.asarray(stored)
        from .codec import decode_cv2

        h, w = int(shape[0]), int(shape[1])
        res = int(self.suffix[2:]) if self.suffix else ((manifest.get("settings") or {}).get("image") or {}).get("size")
        why = jpeg_refusal(stored, h, w, manifest, res)
        if why is not None:
            at = f" at {res} px" if isinstance(res, int) else ""
            raise PackError(f"{what}{at} {why}; not decoded (verify the pack, or rebuild it)")
        img = decode_cv2(np.asarray(stored), self.channels or 1)
        if img is None:
            raise PackError(f"{what} does not decode as JPEG (dataprep verify --decode says more)")
        return img

    @property
    def shapes_name(self) -> str:
        """The stored array of every sample's shape."""
        return self.name(self.keys[2])

    def served_as(self, largest: tuple[int, ...]) -> tuple[str, tuple[int, ...], str, str]:
        """What one sample puts in a batch when the served sample is `largest`: (name, shape, dtype, the
        dtype it is commonly held in instead), for `dataprep plan`."""
        dtype = self.np_dtype.newbyteorder("=").name
        if self.role == "mask":
            return "mask", tuple(largest[:2]), dtype, "int64"
        if self.role == "volume_mask":
            return "mask", tuple(largest), dtype, "int64"
        return self.role, tuple(largest), dtype, "float32"

    def describe(self) -> str:
        shape = "x".join(map(str, self.shape)) if self.fixed else "each its own size"
        return f"{self.role}s, {self.encoding}, {np.dtype(self.dtype).name}, {shape}"

    def shard_arrays(self, items: Sequence[np.ndarray], shapes: Sequence[tuple[int, int, int]]) -> dict[str, np.ndarray]:
        data, offs, shp_key = self.keys
        shp = np.asarray(shapes, SHAPES).reshape(len(shapes), 3)
        if self.fixed:
            pix = np.stack(items) if items else np.zeros((0, *self.shape), self.np_dtype)
            return {self.name(data): pix.astype(self.np_dtype, copy=False), self.name(shp_key): shp}
        items = [np.ascontiguousarray(x, self.np_dtype) if self.encoding == "raw" else x for x in items]
        return {**blob_arrays(items, self.name(data), self.name(offs)), self.name(shp_key): shp}

    def layout(self, split_dir: Path, shards: list[dict]) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        """Every array `load` allocates: (stored name, shape, dtype), in load order."""
        data, offs, shp_key = self.keys
        out = [(self.name(shp_key), rows_shape(shards, (3,)), SHAPES)]
        if self.fixed:
            return out + [(self.name(data), rows_shape(shards, self.shape), self.np_dtype)]
        blob, offsets = blob_shapes(split_dir, shards, self.name(data), self.name(offs))
        return out + [(self.name(data), blob, BYTES), (self.name(offs), offsets, OFFSETS)]

    def load(self, split_dir: Path, shards: list[dict], ctx: LoadContext | None = None) -> dict[str, Any]:
        """The arrays of `layout`, by generic key (e.g. images, offsets, shapes): the data key is the
        (N, *shape) samples when `fixed`, else the byte blob."""
        ctx = ctx or LoadContext()
        data, offs, shp_key = self.keys
        shapes = load_rows(split_dir, shards, self.name(shp_key), SHAPES, (3,), ctx)
        if self.fixed:
            pixels = load_rows(split_dir, shards, self.name(data), self.np_dtype, self.shape, ctx, map_data=ctx.mapped)
            return {data: pixels, shp_key: shapes}
        blob, offsets = load_blob(split_dir, shards, self.name(data), self.name(offs), ctx, map_data=ctx.mapped)
        if len(shapes) and (np.any(shapes <= 0) or (self.channels is not None and np.any(shapes[:, 2] != self.channels))):
            raise PackError(f"{split_dir}: {self.name(shp_key)}.npy holds non-positive sizes or a channel count other than {self.channels}")
        if self.encoding == "raw" and not np.array_equal(np.diff(offsets), shapes.prod(axis=1) * self.np_dtype.itemsize):
            raise PackError(f"{split_dir}: raw {self.role} sizes disagree with their shapes")
        return {data: blob, offs: offsets, shp_key: shapes}

    def sample(self, arrays: dict[str, Any], i: int) -> np.ndarray:
        """Sample i's stored form as a view: pixels (fixed or raw) in their shape and dtype, or JPEG bytes."""
        data, offs, shp_key = self.keys
        if self.fixed:
            return arrays[data][i]
        buf = arrays[data][arrays[offs][i] : arrays[offs][i + 1]]
        if self.encoding == "raw":
            return buf.view(self.np_dtype).reshape(arrays[shp_key][i])
        return buf


def jpeg_refusal(buf, h: int, w: int, manifest: dict[str, Any], res) -> str | None:
    """Why no path decodes `buf` as a JPEG recorded h x w at `res` px, read from its marker segments alone: a
    frame header that disagrees with the record or bytes too few for the frame (jpegseg.jpeg_problem), or a
    frame larger than the pack's build makes (settings.over_caps). What serving and the audit ask before a
    decoder sees a stored JPEG.

    Returns:
        The reason, worded to follow "sample i at R px"; None where it may be decoded.
    """
    why = jpeg_problem(buf, h, w)
    if why is not None:
        return f"holds {why}, but the pack records {w}x{h}"
    why = over_caps(manifest, h, w, res)
    return None if why is None else f"is a {w}x{h} JPEG, {why}"


@dataclass(frozen=True)
class CaptionField(StringsField):
    """A caption per sample (image-text data): UTF-8 text as one blob plus byte offsets, stored as the source
    paths are and served as `Strings`. Unlike a path, a caption is text: it is written strictly (a string that
    is not valid Unicode is refused, never escaped), and `check` holds the blob to valid UTF-8 with every
    caption starting on a character boundary."""

    key: str = "caption"
    blob: str = "captions"
    offsets: str = "caption_offsets"
    relative_to: str = ""

    def shard_arrays(self, items: Sequence[str]) -> dict[str, np.ndarray]:
        return blob_arrays([np.frombuffer(s.encode("utf-8"), np.uint8) for s in items], self.blob, self.offsets)

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        blob, offsets = arrays[self.blob], np.asarray(arrays[self.offsets])
        starts = offsets[:-1][offsets[:-1] < len(blob)]
        inside = np.flatnonzero((np.asarray(blob[starts]) & 0xC0) == 0x80)  # a UTF-8 continuation byte
        if len(inside):
            k = int(np.searchsorted(offsets, starts[inside[0]], "right")) - 1
            return [f"{self.blob}.npy: caption {k} starts inside a UTF-8 character"]
        # decoded in pieces of about 16 MiB cut at caption starts (character boundaries, checked above): no
        # copy of a large blob is made, and an error's position is exact
        cuts = offsets[np.searchsorted(offsets, np.arange(1 << 24, len(blob), 1 << 24))]
        bounds = np.unique(np.concatenate([[0], cuts, [len(blob)]]))
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            try:
                codecs.utf_8_decode(memoryview(np.ascontiguousarray(blob[a:b])), "strict", True)
            except UnicodeDecodeError as e:
                k = int(np.searchsorted(offsets, a + e.start, "right")) - 1
                return [f"{self.blob}.npy: caption {k} is not UTF-8 text ({e.reason})"]
        return []

    def describe(self) -> str:
        return "UTF-8 text, a caption per sample"


CAPTION = CaptionField()


@dataclass(frozen=True)
class CaptionTokensField(IdsField):
    """Every caption's token ids (`--tokenize`): one array per shard, uint16 (uint32 when the vocabulary needs
    it), plus int64 offsets into it in ids; an empty caption may be an empty run. `pad_id` is what the Loader
    pads a caption to a fixed length with; `special_tokens`: the ids include what the tokenizer's
    post-processor adds around a sequence, as `Tokenizer.encode(caption).ids` does."""

    dtype: str
    vocab_size: int = 0  # every stored id is below it (checked on load)
    tokens: str = "caption_tokens"
    offsets: str = "caption_token_offsets"
    pad_id: int = 0
    special_tokens: bool = True

    def to_manifest(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "pad_id": self.pad_id, "special_tokens": self.special_tokens,
                "arrays": [self.tokens, self.offsets],
                "meaning": "every caption's token ids (the manifest's tokenizer); caption_token_offsets index them"}

    @classmethod
    def from_manifest(cls, m: dict[str, Any], where: Path | str) -> "CaptionTokensField":
        try:
            spec = m["fields"]["caption_tokens"]
            tokens, offsets = (str(a) for a in spec["arrays"])
            field = cls(np.dtype(spec["dtype"]).str, int(m["tokenizer"]["vocab_size"]), tokens, offsets, int(spec["pad_id"]),
                        bool(spec["special_tokens"]))
        except (KeyError, TypeError, ValueError) as e:
            raise PackError(f"{where}: malformed caption_tokens field description ({e})") from None
        if field.dtype not in ("<u2", "<u4") or not 0 <= field.pad_id <= np.iinfo(field.np_dtype).max:
            raise PackError(f"{where}: caption token ids stored as {field.dtype} with pad id {field.pad_id}, not uint16 or uint32")
        return field

    def describe(self) -> str:
        return f"caption token ids, {self.np_dtype.name}, vocabulary {self.vocab_size:,}, pad id {self.pad_id}"


def resolution_key(m: dict[str, Any], resolution: int | None, where: Path | str, base: str = "image") -> str:
    """The manifest field of the asked resolution: `base` ("image"), or "image@R" in a multi-resolution pack
    (the largest when `resolution` is None)."""
    have = m.get("resolutions")
    if not have:
        size = m.get("settings", {}).get("image", {}).get("size")
        if resolution is not None and resolution != size:
            raise PackError(f"{where}: no resolution {resolution}; the pack has [{size}]")
        return base
    resolution = max(have) if resolution is None else resolution
    if resolution not in have:
        raise PackError(f"{where}: no resolution {resolution}; the pack has {sorted(have)}")
    return f"{base}@{resolution}"


@dataclass(frozen=True)
class AuditField(RowsField):
    """A fingerprint per sample for `dataprep audit` (dataprep/audit/): `phash`, the 64-bit perceptual hash of
    the sample's pixels at the smallest stored size (uint64, little-endian), or `digest`, 16 bytes of SHA-256
    over the sample as stored at the largest size (its JPEG bytes, or its raw pixels with their shape).
    The manifest's "audit" entry names the hash; a pack hashed otherwise is hashed again on the fly."""

    mappable: bool = False  # small: read into RAM

    @classmethod
    def from_manifest(cls, key: str, spec: dict[str, Any], where: Path | str) -> "AuditField":
        want = AUDIT_FIELDS[key]
        try:
            name, dtype = str(spec["arrays"][0]), np.dtype(spec["dtype"]).str
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise PackError(f"{where}: malformed {key} field description ({e})") from None
        if dtype != want.dtype:
            raise PackError(f"{where}: the {key} field is stored as {dtype}, not {want.dtype}")
        return cls(name, dtype, want.row_shape)

    def to_manifest(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": [None, *self.row_shape], "arrays": [self.name],
                "meaning": AUDIT_MEANING[self.name]}

    def describe(self) -> str:
        return AUDIT_MEANING.get(self.name, super().describe())


PHASH = AuditField("phashes", "<u8")
DIGEST = AuditField("digests", "|u1", (16,))
AUDIT_FIELDS = {"phash": PHASH, "digest": DIGEST}
AUDIT_MEANING = {"phashes": "64-bit perceptual hash of each sample at the smallest stored size (dataprep audit)",
                 "digests": "16 bytes of SHA-256 of each sample as stored at the largest size (dataprep audit: exact copies)"}


def audit_fields(m: dict[str, Any], where: Path | str) -> dict[str, Field]:
    """The audit's fields (`phash`, `digest`) where the manifest has them: packs built before them have none."""
    return {k: AuditField.from_manifest(k, m["fields"][k], where) for k in AUDIT_FIELDS if k in m["fields"]}


def common_fields(m: dict[str, Any], where: Path | str) -> dict[str, Field]:
    """The label, source-path and caption fields (text, and token ids with --tokenize) beside the pixels, where
    the manifest has them."""
    out: dict[str, Field] = {}
    if "label" in m["fields"]:
        out["label"] = label = LabelField.from_manifest(m["fields"]["label"], where)
        # labels are served under the names in `classes`: a list that does not name every class would drop them
        # (an unlabelled dataset) or misname them, silently
        classes = m.get("classes")
        if classes is None and label.num_classes == 0:
            classes = []
        if not isinstance(classes, list) or len(classes) != label.num_classes or not all(isinstance(c, str) for c in classes):
            raise PackError(f"{where}: 'classes' must list the {label.num_classes} class names the label field counts, "
                            f"not {json.dumps(classes)[:80]}")
    out["source"] = StringsField.from_manifest("source", m["fields"]["source"], where)
    if "caption" in m["fields"]:
        out["caption"] = CaptionField.from_manifest("caption", m["fields"]["caption"], where)
    if "caption_tokens" in m["fields"]:
        out["caption_tokens"] = CaptionTokensField.from_manifest(m, where)
    return out


def fields_of(m: dict[str, Any], where: Path | str = "manifest") -> dict[str, Field]:
    """Every field of an image pack: one image field per resolution, labels, source paths, captions."""
    images = {k: ImageField.from_manifest(spec, where) for k, spec in m["fields"].items() if k.split("@")[0] == "image"}
    if not images:
        raise PackError(f"{where}: no image field")
    return {**images, **common_fields(m, where), **audit_fields(m, where)}


def served_fields(m: dict[str, Any], resolution: int | None = None, where: Path | str = "manifest") -> dict[str, Field]:
    """The fields a dataset holds to serve one resolution: the image field first, labels, source paths, captions."""
    key = resolution_key(m, resolution, where)
    return {key: ImageField.from_manifest(m["fields"][key], where), **common_fields(m, where)}


def summary(m: dict[str, Any]) -> list[str]:
    """What `dataprep info` says about an image pack beyond its fields: how the images were made."""
    i = m["settings"]["image"]
    f = m["fields"][resolution_key(m, None, "manifest")]
    if f["encoding"] == "jpeg":
        kept = sum(sp.get("kept_jpeg", 0) for sp in m["splits"].values())
        stored = f"JPEG, quality {i['quality']}" + (f" ({kept:,} source JPEGs that needed no change kept as they were)" if kept else "")
    else:
        stored = f"decoded {np.dtype(f['dtype']).name} pixels, " + ("one shape" if f["layout"] == "fixed" else "each its own size")
    out = [f"images:    stored as {stored}; size {', '.join(map(str, m.get('resolutions') or [i['size']]))} "
           f"({i['resize']}{', upscale' if i['upscale'] else ''}), {'grayscale' if i['grayscale'] else 'color'}"]
    if not m.get("classes"):
        out.append("labels:    none (an unlabelled pack)")
    if "caption" in m["fields"]:
        tok = m.get("tokenizer") if "caption_tokens" in m["fields"] else None
        out.append("captions:  a UTF-8 caption per sample" + (
            f"; tokenized ({np.dtype(m['fields']['caption_tokens']['dtype']).name}, vocabulary {tok['vocab_size']:,}, "
            f"pad id {m['fields']['caption_tokens']['pad_id']}, tokenizer sha256 {str(tok['sha256'])[:12]}...)" if tok else ""))
    return out

