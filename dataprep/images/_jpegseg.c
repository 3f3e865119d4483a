/* Restart segments of baseline JPEGs, compiled: what images/jpegseg.py does in Python, without Python's
 * per-byte and per-call costs, and one thing it cannot do at a usable speed.
 *
 *   region(buf, y0, y1, x0, x1)  -> None | (height, width, sub, top, left)
 *       The frame's size (as jpegseg.jpeg_header reads it) and the smallest JPEG of whole restart segments
 *       that covers rows [y0, y1) and columns [x0, x1): the same bytes jpegseg.region_jpeg makes from
 *       jpegseg.jpeg_layout (tests/test_jpegseg.py holds them equal). `sub` is None where `buf` is to be
 *       decoded whole: no restart layout, or a region that is the whole image. None: not a JPEG, or no
 *       frame header before the scan.
 *
 *   add_restarts(buf, max_interval) -> None | bytes
 *       The same JPEG with a restart marker every `interval` MCUs (jpegseg.restart_interval's rule: the
 *       largest divisor of the MCUs per row up to max_interval), its coefficients unchanged, so it
 *       decodes to exactly the same pixels. The entropy-coded data is Huffman-decoded block by block and
 *       re-emitted bit for bit, except the DC difference of a block whose predictor changes (the first
 *       block of each component after a new restart, or after one of the source's own restarts), which
 *       is coded again with the file's own DC table. None where that cannot be done: not a sequential
 *       8-bit Huffman single-scan JPEG of 1 or 3 components, damaged data (restart markers out of
 *       sequence, no EOI after the last MCU among them), or a DC difference of a size
 *       the file's table has no code for (its tables were optimised for the differences it held).
 *
 * Both only read `buf`; every length read from the file is checked against the buffer, and what they
 * allocate is bounded by the buffer's size (a frame that claims more MCUs than its bytes can hold is
 * refused before anything is allocated).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_ssize_t sof, dri_at, sos, header;   /* offsets: frame header, DRI (or -1), SOS, entropy data */
    int height, width, comps, sof_marker, precision;
    int hs[4], vs[4], hmax, vmax, dri;
    int scan_comps, dc_tab[4], ac_tab[4], ss, se, ah, al;
    const uint8_t *dht[8];                  /* last definition of DC (0-3) and AC (4-7) tables: counts */
} Frame;

enum { NOT_JPEG = -1, NO_LAYOUT = 1, SCAN = 0 };

static int is_sof(int m) {
    return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

static int standalone(int m) { /* RSTn and TEM: markers without a length */
    return (m >= 0xD0 && m <= 0xD7) || m == 0x01;
}

/* The one step of every walk through the marker segments here (jpegseg._next_marker, in C): the marker at
 * b[*i], its fill bytes (FF FF) stepped over, *i moved to the FF before its code and *len set to its length
 * field (0 for a standalone marker). -1 where the walk ends: fewer than four bytes left, no marker, or a
 * length field under 2. A walk starts at 2, past SOI, and goes on at *i + 2 + *len. */
static int next_marker(const uint8_t *b, Py_ssize_t n, Py_ssize_t *i, Py_ssize_t *len) {
    while (*i + 3 < n && b[*i] == 0xFF && b[*i + 1] == 0xFF) *i += 1;
    if (*i + 3 >= n || b[*i] != 0xFF) return -1;
    int m = b[*i + 1];
    *len = standalone(m) ? 0 : ((Py_ssize_t)b[*i + 2] << 8) | b[*i + 3];
    return standalone(m) || *len >= 2 ? m : -1;
}

/* Walk the marker segments up to the scan. NOT_JPEG: no frame header is found (jpegseg.jpeg_header's None);
 * NO_LAYOUT: a frame header is found (height and width set) but what follows is not one scan of a
 * sequential frame; SCAN: up to the entropy-coded data, everything read. */
static int parse(const uint8_t *b, Py_ssize_t n, Frame *f) {
    memset(f, 0, sizeof(*f));
    f->sof = f->dri_at = -1;
    if (n < 4 || b[0] != 0xFF || b[1] != 0xD8) return NOT_JPEG;
    int bad = 0; /* something after the frame header that rules out a layout */
    for (Py_ssize_t i = 2, len = 0;; i += 2 + len) {
        int m = next_marker(b, n, &i, &len);
        /* the walk's end; a standalone marker before the scan (jpegseg.jpeg_layout finds no layout in the copy) */
        if (m < 0 || standalone(m) || m == 0xD9 || m == 0xD8) return f->sof >= 0 ? NO_LAYOUT : NOT_JPEG;
        if (m == 0xDA && f->sof < 0) return NOT_JPEG;
        if (is_sof(m) && f->sof < 0) {
            if (i + 9 >= n || len < 8) return NOT_JPEG;
            f->sof = i;
            f->sof_marker = m;
            f->precision = b[i + 4];
            f->height = (b[i + 5] << 8) | b[i + 6];
            f->width = (b[i + 7] << 8) | b[i + 8];
            f->comps = b[i + 9];
            if (i + 2 + len > n) return NO_LAYOUT;
            if (m != 0xC0 && m != 0xC1) return NO_LAYOUT;
            if ((f->comps != 1 && f->comps != 3) || len != 8 + 3 * f->comps) return NO_LAYOUT;
            f->hmax = f->vmax = 1;
            for (int k = 0; k < f->comps; k++) {
                int s = b[i + 11 + 3 * k];
                f->hs[k] = s >> 4;
                f->vs[k] = s & 15;
                if (f->hs[k] < 1 || f->vs[k] < 1) return NO_LAYOUT;
                if (f->comps == 3) {
                    if (f->hs[k] > f->hmax) f->hmax = f->hs[k];
                    if (f->vs[k] > f->vmax) f->vmax = f->vs[k];
                }
            }
            if (f->comps == 1) f->hs[0] = f->vs[0] = 1; /* one component: an MCU is one block */
            continue;
        }
        if (i + 2 + len > n) return f->sof >= 0 ? NO_LAYOUT : NOT_JPEG;
        if (is_sof(m)) bad = 1; /* a second frame header */
        else if (m == 0xDD) {
            if (len != 4) bad = 1;
            else { f->dri = (b[i + 4] << 8) | b[i + 5]; f->dri_at = i; }
        } else if (m == 0xC4) {
            Py_ssize_t j = i + 4, end = i + 2 + len;
            while (j + 17 <= end) {
                int tc = b[j] >> 4, th = b[j] & 15, total = 0;
                if (tc > 1 || th > 3) { bad = 1; break; }
                for (int k = 1; k <= 16; k++) total += b[j + k];
                if (total > 256 || j + 17 + total > end) { bad = 1; break; }
                f->dht[tc * 4 + th] = b + j + 1;
                j += 17 + total;
            }
        } else if (m == 0xDA) {
            f->sos = i;
            f->header = i + 2 + len;
            int ns = b[i + 4];
            if (bad || ns != f->comps || len != 6 + 2 * ns) return NO_LAYOUT;
            f->scan_comps = ns;
            for (int k = 0; k < ns; k++) {
                int t = b[i + 6 + 2 * k];
                f->dc_tab[k] = t >> 4;
                f->ac_tab[k] = t & 15;
            }
            f->ss = b[i + 5 + 2 * ns];
            f->se = b[i + 6 + 2 * ns];
            f->ah = b[i + 7 + 2 * ns] >> 4;
            f->al = b[i + 7 + 2 * ns] & 15;
            return SCAN;
        }
    }
}

/* ---------------------------------------------------------------------------------------- region */

/* jpegseg.jpeg_header, in C: the first frame header's height and width, found by walking the marker
 * segments (standalone markers skipped, everything else by its length); 0 where that gives None. */
static int header_walk(const uint8_t *b, Py_ssize_t n, int *height, int *width) {
    if (n < 4 || b[0] != 0xFF || b[1] != 0xD8) return 0;
    for (Py_ssize_t i = 2, len = 0;; i += 2 + len) {
        int m = next_marker(b, n, &i, &len);
        if (m < 0 || m == 0xD9 || m == 0xDA) return 0;
        if (is_sof(m)) {
            if (i + 9 >= n || len < 8) return 0;
            *height = (b[i + 5] << 8) | b[i + 6];
            *width = (b[i + 7] << 8) | b[i + 8];
            return 1;
        }
    }
}

/* jpegseg.jpeg_layout's walk, in C: every segment by its length up to the scan (a standalone marker, which has
 * none, ends it); SCAN where it finds one sequential frame with a restart period and a scan of all its
 * components (f's sof, header, height, width, hmax, vmax and dri set), NO_LAYOUT for anything else, so that
 * region() cuts what the Python path cuts. */
static int layout_walk(const uint8_t *b, Py_ssize_t n, Frame *f) {
    memset(f, 0, sizeof(*f));
    f->sof = f->dri_at = -1;
    if (n < 4 || b[0] != 0xFF || b[1] != 0xD8) return NO_LAYOUT;
    for (Py_ssize_t i = 2, len = 0;; i += 2 + len) {
        int m = next_marker(b, n, &i, &len);
        if (m < 0 || standalone(m) || i + 2 + len > n) return NO_LAYOUT;
        if (m == 0xC0 || m == 0xC1) {
            if (f->sof >= 0 || len < 8) return NO_LAYOUT;
            f->sof = i;
            f->comps = b[i + 9];
            if ((f->comps != 1 && f->comps != 3) || len != 8 + 3 * f->comps) return NO_LAYOUT;
            f->height = (b[i + 5] << 8) | b[i + 6];
            f->width = (b[i + 7] << 8) | b[i + 8];
            f->hmax = f->vmax = 1;
            for (int k = 0; k < f->comps; k++) {
                int s = b[i + 11 + 3 * k];
                if ((s >> 4) < 1 || (s & 15) < 1) return NO_LAYOUT;
                if (f->comps == 3) {
                    if ((s >> 4) > f->hmax) f->hmax = s >> 4;
                    if ((s & 15) > f->vmax) f->vmax = s & 15;
                }
            }
        } else if (is_sof(m)) {
            return NO_LAYOUT; /* progressive, lossless or arithmetic-coded frames */
        } else if (m == 0xDD) {
            if (len != 4) return NO_LAYOUT;
            f->dri = (b[i + 4] << 8) | b[i + 5];
            f->dri_at = i;
        } else if (m == 0xDA) {
            if (f->sof < 0 || f->dri == 0 || b[i + 4] != f->comps) return NO_LAYOUT;
            f->sos = i;
            f->header = i + 2 + len;
            return SCAN;
        } else if (m == 0xD8 || m == 0xD9) {
            return NO_LAYOUT;
        }
    }
}


static PyObject *region(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t y0, y1, x0, x1;
    if (!PyArg_ParseTuple(args, "y*nnnn", &view, &y0, &y1, &x0, &x1)) return NULL;
    const uint8_t *b = view.buf;
    Py_ssize_t n = view.len;
    Frame f;
    int height = 0, width = 0;
    if (!header_walk(b, n, &height, &width)) { PyBuffer_Release(&view); Py_RETURN_NONE; }
    int st = layout_walk(b, n, &f);
    PyObject *res = NULL;
    Py_ssize_t mcu_h = 8 * f.vmax, mcu_w = 8 * f.hmax;
    Py_ssize_t per_row = f.width ? (f.width + mcu_w - 1) / mcu_w : 0, rows = f.height ? (f.height + mcu_h - 1) / mcu_h : 0;
    Py_ssize_t *starts = NULL, *ends = NULL;
    if (st != SCAN || f.height == 0 || f.width == 0 || f.dri == 0 || per_row % f.dri) goto whole;
    Py_ssize_t columns = per_row / f.dri, segments = rows * columns;
    if (segments - 1 > n / 2) goto whole; /* more markers than the bytes can hold */
    starts = PyMem_Malloc(sizeof(Py_ssize_t) * segments);
    ends = PyMem_Malloc(sizeof(Py_ssize_t) * segments);
    if (!starts || !ends) { PyErr_NoMemory(); goto done; }
    /* the markers in the entropy-coded data: every RST before the first EOI ends a segment; an RST after it,
     * one out of sequence (decoders resynchronise there, a cut would renumber it), or a count that does not
     * add up, means no layout (as jpegseg._segments decides) */
    Py_ssize_t k = 0, eoi = -1;
    starts[0] = f.header;
    for (Py_ssize_t i = f.header; i + 1 < n; i++) {
        if (b[i] != 0xFF) {
            const uint8_t *p = memchr(b + i, 0xFF, (size_t)(n - 1 - i));
            if (!p) break;
            i = p - b;
        }
        int m = b[i + 1];
        if ((m & 0xF8) == 0xD0) {
            if (eoi >= 0 || k + 1 >= segments || (m & 7) != (k & 7)) { k = -1; break; }
            ends[k] = i;
            starts[++k] = i + 2;
        } else if (m == 0xD9 && eoi < 0) {
            eoi = i;
        }
    }
    if (k != segments - 1 || eoi < 0) goto whole;
    ends[segments - 1] = eoi;
    Py_ssize_t cw = f.dri * mcu_w;
    /* a box beyond 2**40 px cuts as one at 2**40 does (the frame is at most 65535 px), and the rounding
     * below cannot overflow for boxes at the edges of Py_ssize_t */
    const Py_ssize_t far = (Py_ssize_t)1 << 40;
    y0 = y0 < -far ? -far : y0 > far ? far : y0;
    y1 = y1 < -far ? -far : y1 > far ? far : y1;
    x0 = x0 < -far ? -far : x0 > far ? far : x0;
    x1 = x1 < -far ? -far : x1 > far ? far : x1;
    Py_ssize_t r0 = y0 >= 0 ? y0 / mcu_h : -((-y0 + mcu_h - 1) / mcu_h), c0 = x0 >= 0 ? x0 / cw : -((-x0 + cw - 1) / cw);
    Py_ssize_t r1 = y1 >= 0 ? (y1 + mcu_h - 1) / mcu_h : -((-y1) / mcu_h), c1 = x1 >= 0 ? (x1 + cw - 1) / cw : -((-x1) / cw);
    if (r0 < 0) r0 = 0;
    if (c0 < 0) c0 = 0;
    if (r1 > rows) r1 = rows;
    if (c1 > columns) c1 = columns;
    if (r1 <= r0 || c1 <= c0) { r0 = 0; r1 = rows; c0 = 0; c1 = columns; }
    if (r0 == 0 && r1 == rows && c0 == 0 && c1 == columns) goto whole;
    {
        Py_ssize_t sub_h = (f.height < r1 * mcu_h ? f.height : r1 * mcu_h) - r0 * mcu_h;
        Py_ssize_t sub_w = (f.width < c1 * cw ? f.width : c1 * cw) - c0 * cw;
        Py_ssize_t span = c1 - c0, size = f.header + 2 * (r1 - r0);
        for (Py_ssize_t r = r0; r < r1; r++) size += ends[r * columns + c1 - 1] - starts[r * columns + c0];
        PyObject *out = PyBytes_FromStringAndSize(NULL, size);
        if (!out) goto done;
        uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
        memcpy(o, b, f.sof + 5);
        o[f.sof + 5] = (uint8_t)(sub_h >> 8); o[f.sof + 6] = (uint8_t)sub_h;
        o[f.sof + 7] = (uint8_t)(sub_w >> 8); o[f.sof + 8] = (uint8_t)sub_w;
        memcpy(o + f.sof + 9, b + f.sof + 9, f.header - f.sof - 9);
        uint8_t *w = o + f.header;
        for (Py_ssize_t r = r0, row = 0; r < r1; r++, row++) {
            Py_ssize_t first = r * columns + c0, a = starts[first], z = ends[first + span - 1];
            memcpy(w, b + a, z - a);
            for (Py_ssize_t j = 0; j + 1 < span; j++) /* the markers inside the row, numbered as the region counts */
                w[ends[first + j] - a + 1] = (uint8_t)(0xD0 | ((row * span + j) & 7));
            w += z - a;
            w[0] = 0xFF;
            w[1] = r + 1 < r1 ? (uint8_t)(0xD0 | ((row * span + span - 1) & 7)) : 0xD9;
            w += 2;
        }
        res = Py_BuildValue("(iiNnn)", height, width, out, r0 * mcu_h, c0 * cw);
        goto done;
    }
whole: /* the frame size is the first frame header's, as jpeg_header reads it */
    res = Py_BuildValue("(iiOii)", height, width, Py_None, 0, 0);
done:
    PyMem_Free(starts);
    PyMem_Free(ends);
    PyBuffer_Release(&view);
    return res;
}

/* ---------------------------------------------------------------------------------- add_restarts */

typedef struct {            /* a Huffman table for decoding (lookahead on 9 bits, then code by code) */
    uint8_t look_len[512], look_sym[512];
    int32_t maxcode[18], valoff[18];
    uint8_t vals[256];
    uint16_t code_of[256]; /* for encoding: the code and length of each symbol (0: none) */
    uint8_t len_of[256];
} Huff;

static int build_huff(const uint8_t *counts, Huff *h) {
    memset(h, 0, sizeof(*h));
    int total = 0;
    for (int l = 1; l <= 16; l++) total += counts[l - 1];
    if (total > 256) return 0;
    memcpy(h->vals, counts + 16, total);
    int code = 0, k = 0;
    for (int l = 1; l <= 16; l++) {
        h->valoff[l] = k - code;
        for (int j = 0; j < counts[l - 1]; j++, k++, code++) {
            if (code >= (1 << l)) return 0; /* more codes than the length allows */
            int s = h->vals[k];
            h->code_of[s] = (uint16_t)code;
            h->len_of[s] = (uint8_t)l;
            if (l <= 9)
                for (int e = code << (9 - l), z = (code + 1) << (9 - l); e < z; e++) {
                    h->look_len[e] = (uint8_t)l;
                    h->look_sym[e] = (uint8_t)s;
                }
        }
        h->maxcode[l] = counts[l - 1] ? code - 1 : -1;
        code <<= 1;
    }
    h->maxcode[17] = 0x7FFFFFFF;
    return 1;
}

typedef struct {
    const uint8_t *b;
    Py_ssize_t pos, n;
    uint64_t acc;      /* bits, the next one at bit (nbits - 1) */
    int nbits, fake;   /* of them, the lowest `fake` are zeros fed past a marker or the end */
} Reader;

static void fill(Reader *r) {
    while (r->nbits <= 56) {
        int byte = 0;
        if (r->fake == 0 && r->pos < r->n) {
            byte = r->b[r->pos];
            if (byte == 0xFF) {
                if (r->pos + 1 < r->n && r->b[r->pos + 1] == 0x00) r->pos += 2;
                else { byte = 0; r->fake += 8; } /* a marker: not consumed */
            } else r->pos++;
        } else r->fake += 8;
        r->acc = (r->acc << 8) | (uint64_t)byte;
        r->nbits += 8;
    }
}

static inline int bits(Reader *r, int k, int *v) { /* read k (<= 16) bits; 0 past the data */
    if (r->nbits < k) fill(r);
    r->nbits -= k;
    if (r->nbits < r->fake) return 0;
    *v = k ? (int)((r->acc >> r->nbits) & ((1u << k) - 1)) : 0;
    return 1;
}

static inline int symbol(Reader *r, const Huff *h, int *code, int *len) {
    if (r->nbits < 16) fill(r);
    int peek = (int)((r->acc >> (r->nbits - 9)) & 511);
    int l = h->look_len[peek];
    if (l) {
        r->nbits -= l;
        if (r->nbits < r->fake) return -1;
        *code = peek >> (9 - l);
        *len = l;
        return h->look_sym[peek];
    }
    int c = (int)((r->acc >> (r->nbits - 9)) & 511);
    for (l = 10; l <= 16; l++) {
        c = (int)((r->acc >> (r->nbits - l)) & ((1u << l) - 1));
        if (c <= h->maxcode[l]) break;
    }
    if (l > 16) return -1;
    r->nbits -= l;
    if (r->nbits < r->fake) return -1;
    *code = c;
    *len = l;
    return h->vals[h->valoff[l] + c];
}

typedef struct {
    uint8_t *o;
    Py_ssize_t len, cap;
    uint64_t acc;
    int nbits;
    int failed;
} Writer;

static void put_byte(Writer *w, uint8_t v) {
    if (w->len + 2 > w->cap) {
        Py_ssize_t cap = w->cap * 2 + 64;
        uint8_t *o = PyMem_Realloc(w->o, cap);
        if (!o) { w->failed = 1; return; }
        w->o = o;
        w->cap = cap;
    }
    w->o[w->len++] = v;
}

static inline void put(Writer *w, int v, int k) {
    w->acc = (w->acc << k) | ((uint64_t)v & ((1u << k) - 1));
    w->nbits += k;
    while (w->nbits >= 8) {
        uint8_t byte = (uint8_t)(w->acc >> (w->nbits - 8));
        w->nbits -= 8;
        put_byte(w, byte);
        if (byte == 0xFF) put_byte(w, 0x00);
    }
}

static void pad(Writer *w) { /* to a byte boundary with ones, as encoders do before a marker */
    if (w->nbits) put(w, 0x7F, 8 - w->nbits);
}

static int category(int v) {
    int a = v < 0 ? -v : v, s = 0;
    while (a) { s++; a >>= 1; }
    return s;
}

/* Code lengths for DC categories 0-11 seen `freq` times (a plain Huffman code: 12 symbols and the
 * reserved all-ones code give at most 12 bits, under JPEG's 16), as a DHT table body: 16 counts, then
 * the symbols by length. The reserved symbol (frequency 1, taken last) keeps the all-ones code unused. */
static int optimal_dc(const long *freq, uint8_t *body) {
    long f[13];
    int size[13] = {0}, others[13];
    for (int i = 0; i < 12; i++) f[i] = freq[i];
    f[12] = 1;
    for (int i = 0; i < 13; i++) others[i] = -1;
    for (;;) {
        int c1 = -1, c2 = -1;
        for (int i = 0; i < 13; i++)
            if (f[i] && (c1 < 0 || f[i] <= f[c1])) c1 = i;
        for (int i = 0; i < 13; i++)
            if (f[i] && i != c1 && (c2 < 0 || f[i] <= f[c2])) c2 = i;
        if (c2 < 0) break;
        f[c1] += f[c2];
        f[c2] = 0;
        for (size[c1]++; others[c1] >= 0; size[c1]++) c1 = others[c1];
        others[c1] = c2;
        for (size[c2]++; others[c2] >= 0; size[c2]++) c2 = others[c2];
    }
    memset(body, 0, 16);
    int longest = 0, k = 16;
    for (int i = 0; i < 13; i++)
        if (size[i]) { body[size[i] - 1]++; if (size[i] > longest) longest = size[i]; }
    body[longest - 1]--; /* the reserved symbol's code */
    for (int l = 1; l <= 16; l++)
        for (int i = 0; i < 12; i++)
            if (size[i] == l) body[k++] = (uint8_t)i;
    return k;
}

typedef struct {
    const Frame *f;
    const uint8_t *b;
    Py_ssize_t n, mcus;
    int interval, blocks[4];
    Huff *tabs;     /* the file's tables: DC 0-3, AC 4-7 */
    Huff *dc_out;   /* NULL: DC differences copied where unchanged, else coded again with these (by table) */
    long freq[4][12];
} Job;

enum { DONE = 0, DAMAGED = 1, NO_CODE = 2 };

/* One pass over the entropy-coded data: into `w` (NULL: only the output DC categories counted). */
static int transcode(Job *j, Writer *w) {
    const Frame *f = j->f;
    Reader r = {j->b, f->header, j->n, 0, 0, 0};
    int in_pred[4] = {0}, out_pred[4] = {0};
    memset(j->freq, 0, sizeof(j->freq));
    for (Py_ssize_t m = 0; m < j->mcus; m++) {
        if (f->dri && m && m % f->dri == 0) { /* the source's own restart: drop its padding, pass the marker */
            r.acc = 0; r.nbits = 0; r.fake = 0;
            while (r.pos + 1 < j->n && r.b[r.pos] == 0xFF && r.b[r.pos + 1] == 0xFF) r.pos++;
            /* a marker out of sequence makes decoders resynchronise (libjpeg skips or pads MCUs), so the
             * source shows other pixels than its coefficients in order would: keep it as it is */
            if (r.pos + 1 >= j->n || r.b[r.pos] != 0xFF || r.b[r.pos + 1] != (0xD0 | ((m / f->dri - 1) & 7))) return DAMAGED;
            r.pos += 2;
            memset(in_pred, 0, sizeof(in_pred));
        }
        if (m && m % j->interval == 0) {
            if (w) {
                pad(w);
                put_byte(w, 0xFF);
                put_byte(w, (uint8_t)(0xD0 | ((m / j->interval - 1) & 7)));
            }
            memset(out_pred, 0, sizeof(out_pred));
        }
        for (int c = 0; c < f->comps; c++) {
            const Huff *dc = &j->tabs[f->dc_tab[c]], *ac = &j->tabs[4 + f->ac_tab[c]];
            const Huff *recode = j->dc_out ? &j->dc_out[f->dc_tab[c]] : NULL;
            for (int k = 0; k < j->blocks[c]; k++) {
                int code, len, v = 0;
                int s = symbol(&r, dc, &code, &len);
                if (s < 0 || s > 11 || !bits(&r, s, &v)) return DAMAGED;
                int diff = s == 0 ? 0 : (v < (1 << (s - 1)) ? v - (1 << s) + 1 : v);
                int value = in_pred[c] + diff;
                in_pred[c] = value;
                int out = value - out_pred[c];
                out_pred[c] = value;
                int t = category(out);
                if (t > 11) return DAMAGED;
                j->freq[f->dc_tab[c]][t]++;
                if (w && out == diff && !recode) {
                    put(w, code, len);
                    put(w, v, s);
                } else if (w) {
                    const Huff *h = recode ? recode : dc;
                    if (!h->len_of[t]) return NO_CODE;
                    put(w, h->code_of[t], h->len_of[t]);
                    put(w, out >= 0 ? out : out + (1 << t) - 1, t);
                }
                for (int z = 1; z < 64;) {
                    int rs = symbol(&r, ac, &code, &len);
                    if (rs < 0) return DAMAGED;
                    if (w) put(w, code, len);
                    int run = rs >> 4, size = rs & 15;
                    if (size == 0) {
                        if (run != 15) break; /* end of block */
                        z += 16;
                    } else {
                        if (!bits(&r, size, &v)) return DAMAGED;
                        if (w) put(w, v, size);
                        z += run + 1;
                    }
                    if (z > 64) return DAMAGED;
                }
            }
        }
        if (w && w->failed) return DONE;
    }
    /* the source's EOI after its last MCU: decoders refuse a file cut before it, so its copy is refused too */
    while (r.pos + 1 < j->n && r.b[r.pos] == 0xFF && r.b[r.pos + 1] == 0xFF) r.pos++;
    if (r.pos + 1 >= j->n || r.b[r.pos] != 0xFF || r.b[r.pos + 1] != 0xD9) return DAMAGED;
    if (w) {
        pad(w);
        put_byte(w, 0xFF);
        put_byte(w, 0xD9);
    }
    return DONE;
}

/* The header up to the scan with its DRI left out, a DRI of `interval` and (where DC tables are coded
 * again) a DHT redefining them, then the scan header: a later table definition replaces an earlier one. */
static void write_header(const Frame *f, const uint8_t *b, int interval, const uint8_t bodies[4][28], const int sizes[4], Writer *w) {
    for (Py_ssize_t i = 0; i < f->sos; i++) {
        if (f->dri_at >= 0 && i == f->dri_at) { i += 5; continue; }
        put_byte(w, b[i]);
    }
    put_byte(w, 0xFF); put_byte(w, 0xDD); put_byte(w, 0x00); put_byte(w, 0x04);
    put_byte(w, (uint8_t)(interval >> 8)); put_byte(w, (uint8_t)interval);
    int total = 0;
    for (int t = 0; t < 4; t++) total += sizes[t] ? 1 + sizes[t] : 0;
    if (total) {
        put_byte(w, 0xFF); put_byte(w, 0xC4);
        put_byte(w, (uint8_t)((total + 2) >> 8)); put_byte(w, (uint8_t)(total + 2));
        for (int t = 0; t < 4; t++) {
            if (!sizes[t]) continue;
            put_byte(w, (uint8_t)t); /* class 0 (DC), table t */
            for (int k = 0; k < sizes[t]; k++) put_byte(w, bodies[t][k]);
        }
    }
    for (Py_ssize_t i = f->sos; i < f->header; i++) put_byte(w, b[i]);
}

static PyObject *add_restarts(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    int max_interval;
    if (!PyArg_ParseTuple(args, "y*i", &view, &max_interval)) return NULL;
    Frame f;
    Job j;
    memset(&j, 0, sizeof(j));
    Writer w = {0};
    PyObject *res = NULL;
    j.f = &f;
    j.b = view.buf;
    j.n = view.len;
    if (parse(j.b, j.n, &f) != SCAN || f.precision != 8 || f.ss != 0 || f.se != 63 || f.ah || f.al || f.width == 0 || f.height == 0)
        goto none;
    Py_ssize_t mcu_h = 8 * f.vmax, mcu_w = 8 * f.hmax;
    Py_ssize_t per_row = (f.width + mcu_w - 1) / mcu_w, rows = (f.height + mcu_h - 1) / mcu_h;
    j.mcus = per_row * rows;
    int per_mcu = 0;
    for (int c = 0; c < f.comps; c++) { j.blocks[c] = f.hs[c] * f.vs[c]; per_mcu += j.blocks[c]; }
    if (per_mcu > 10) goto none;
    /* every block costs at least two bits (a DC code and an end of block): a frame that claims more than
     * its bytes hold is damaged, and is refused before anything is allocated */
    if (j.mcus > (j.n - f.header) * 4 / per_mcu + 1) goto none;
    j.interval = 1;
    for (int d = 1; d <= max_interval && d <= per_row; d++)
        if (per_row % d == 0) j.interval = d;
    if (f.dri == j.interval) goto none; /* its layout already serves regions */
    j.tabs = PyMem_Calloc(12, sizeof(Huff));
    if (!j.tabs) { PyErr_NoMemory(); goto done; }
    for (int c = 0; c < f.comps; c++) {
        int d = f.dc_tab[c], a = f.ac_tab[c];
        if (d > 3 || a > 3 || !f.dht[d] || !f.dht[4 + a]) goto none;
        if (!build_huff(f.dht[d], &j.tabs[d]) || !build_huff(f.dht[4 + a], &j.tabs[4 + a])) goto none;
        /* a DC category above 11, even unused: libjpeg refuses tables with one above 15 when the scan
         * starts, and the DHT a rebuild writes would replace the table, so that the copy decodes and the
         * source does not */
        int total = 0;
        for (int k = 0; k < 16; k++) total += f.dht[d][k];
        for (int v = 0; v < total; v++)
            if (f.dht[d][16 + v] > 11) goto none;
    }
    uint8_t bodies[4][28];
    int sizes[4] = {0};
    for (int attempt = 0; attempt < 2; attempt++) {
        w.cap = j.n + j.n / 8 + 256 + 4 * (j.mcus / j.interval + 1);
        w.len = 0; w.acc = 0; w.nbits = 0;
        w.o = w.o ? w.o : PyMem_Malloc(w.cap);
        if (!w.o) { PyErr_NoMemory(); goto done; }
        write_header(&f, j.b, j.interval, (const uint8_t (*)[28])bodies, sizes, &w);
        int st = transcode(&j, &w);
        if (w.failed) { PyErr_NoMemory(); goto done; }
        if (st == DONE) {
            res = PyBytes_FromStringAndSize((const char *)w.o, w.len);
            goto done;
        }
        if (st == DAMAGED || attempt) goto none;
        /* the file's DC tables lack a size some new difference has (they were optimised for the old ones):
         * count every size, then code every DC difference with tables made for them */
        if (transcode(&j, NULL) != DONE) goto none;
        j.dc_out = j.tabs + 8;
        for (int t = 0; t < 4; t++) {
            long seen = 0;
            for (int s = 0; s < 12; s++) seen += j.freq[t][s];
            if (!seen) continue;
            sizes[t] = optimal_dc(j.freq[t], bodies[t]);
            if (!build_huff(bodies[t], &j.dc_out[t])) goto none;
        }
    }
none:
    res = Py_None;
    Py_INCREF(res);
done:
    PyMem_Free(j.tabs);
    PyMem_Free(w.o);
    PyBuffer_Release(&view);
    return res;
}

static PyMethodDef methods[] = {
    {"region", region, METH_VARARGS, "region(buf, y0, y1, x0, x1) -> None | (height, width, sub, top, left)"},
    {"add_restarts", add_restarts, METH_VARARGS, "add_restarts(buf, max_interval) -> None | bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegseg", "Restart segments of baseline JPEGs, compiled.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__jpegseg(void) { return PyModule_Create(&module); }
