//! The synthetic camera: moving colour bars, a bouncing box, and a stamp
//! burned into the picture that a viewer reads back after lossy H.264.
//!
//! The stamp is the frame counter (32 bits) and the wall-clock capture time
//! (64 bits of microseconds since the Unix epoch), followed by a CRC-8, drawn
//! as [`CELL`] × [`CELL`] luma cells (black 0, white 1) row after row from
//! the top-left corner, [`STAMP_BITS`] cells in all. Below the cells the same
//! values are printed in digits for a human (`#000123 12:34:56.789`, UTC).
//! Cells are macroblock-aligned and far apart in level (16 against 235), so
//! the stamp survives coding at any usable bitrate; [`read_stamp`] averages
//! the middle of each cell and checks the CRC.

use crate::picture::Picture;

/// Side of a stamp cell in pixels.
pub const CELL: usize = 8;

/// Cells in the stamp: 32 counter bits, 64 time bits, 8 CRC bits.
pub const STAMP_BITS: usize = 104;

/// The smallest picture the pattern draws into.
pub const MIN_SIZE: (usize, usize) = (128, 96);

/// What the stamp carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The frame counter (frame 0 first).
    pub frame: u32,
    /// Capture time in microseconds since the Unix epoch.
    pub time_us: u64,
}

/// Luma of a 0 cell and of a 1 cell.
const LEVELS: [u8; 2] = [16, 235];

/// 75 % colour bars (BT.601, limited range) as (Y, U, V): white, yellow,
/// cyan, green, magenta, red, blue.
const BARS: [(u8, u8, u8); 7] = [
    (180, 128, 128),
    (162, 44, 142),
    (131, 156, 44),
    (112, 72, 58),
    (84, 184, 198),
    (65, 100, 212),
    (35, 212, 114),
];

/// CRC-8 (polynomial 0x07) of `bytes`.
fn crc8(bytes: &[u8]) -> u8 {
    let mut crc = 0u8;
    for &b in bytes {
        crc ^= b;
        for _ in 0..8 {
            crc = if crc & 0x80 != 0 {
                (crc << 1) ^ 0x07
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The stamp's 13 bytes: counter and time big-endian, then their CRC-8.
fn stamp_bytes(s: Stamp) -> [u8; 13] {
    let mut b = [0u8; 13];
    b[..4].copy_from_slice(&s.frame.to_be_bytes());
    b[4..12].copy_from_slice(&s.time_us.to_be_bytes());
    b[12] = crc8(&b[..12]);
    b
}

/// Stamp rows for a picture `width` pixels wide.
fn stamp_rows(width: usize) -> usize {
    STAMP_BITS.div_ceil(width / CELL)
}

/// True if the pattern fits a `width` × `height` picture (at least [`MIN_SIZE`], even sides).
pub fn fits(width: usize, height: usize) -> bool {
    width >= MIN_SIZE.0
        && height >= MIN_SIZE.1
        && width.is_multiple_of(2)
        && height.is_multiple_of(2)
}

/// Draws frame `stamp.frame` of the pattern into `pic`, stamped with `stamp`.
///
/// # Panics
/// If `pic` is smaller than [`MIN_SIZE`] (see [`fits`]).
pub fn draw(pic: &mut Picture, stamp: Stamp) {
    let (w, h) = (pic.width(), pic.height());
    assert!(fits(w, h), "pattern needs at least 128x96, got {w}x{h}");
    let n = stamp.frame as usize;
    let top = stamp_rows(w) * CELL;
    let text_h = 2 * 5 + 6;
    let (y, u, v) = pic.planes_mut();
    // Bars scrolling left 2 px a frame, under the stamp and the text.
    let bar_w = w.div_ceil(BARS.len());
    let shift = n * 2;
    for row in 0..h {
        let line = &mut y[row * w..(row + 1) * w];
        for (x, px) in line.iter_mut().enumerate() {
            *px = BARS[((x + shift) / bar_w) % BARS.len()].0;
        }
    }
    for row in 0..h / 2 {
        for x in 0..w / 2 {
            let bar = BARS[((2 * x + shift) / bar_w) % BARS.len()];
            u[row * w / 2 + x] = bar.1;
            v[row * w / 2 + x] = bar.2;
        }
    }
    // A box bouncing in the lower part, black with a white edge.
    let area_top = top + text_h;
    let side = ((h - area_top) / 3).max(8) & !1;
    let span_x = w.saturating_sub(side).max(1);
    let span_y = (h - area_top).saturating_sub(side).max(1);
    let bounce = |t: usize, span: usize| {
        let p = t % (2 * span);
        if p < span { p } else { 2 * span - p }
    };
    let bx = bounce(n * 3, span_x);
    let by = area_top + bounce(n * 2, span_y);
    for row in by..(by + side).min(h) {
        for x in bx..(bx + side).min(w) {
            let edge = row < by + 2 || row + 2 >= by + side || x < bx + 2 || x + 2 >= bx + side;
            y[row * w + x] = if edge { 235 } else { 16 };
        }
    }
    for row in by / 2..((by + side) / 2).min(h / 2) {
        for x in bx / 2..((bx + side) / 2).min(w / 2) {
            u[row * w / 2 + x] = 128;
            v[row * w / 2 + x] = 128;
        }
    }
    // The stamp's cells and the text band, grey in chroma.
    for row in 0..(area_top / 2).min(h / 2) {
        u[row * w / 2..(row + 1) * w / 2].fill(128);
        v[row * w / 2..(row + 1) * w / 2].fill(128);
    }
    for row in top..area_top.min(h) {
        y[row * w..(row + 1) * w].fill(16);
    }
    let bytes = stamp_bytes(stamp);
    let per_row = w / CELL;
    for row in 0..top {
        let line = &mut y[row * w..(row + 1) * w];
        for (cx, cell) in line.chunks_exact_mut(CELL).enumerate() {
            let i = (row / CELL) * per_row + cx;
            let bit = i < STAMP_BITS && bytes[i / 8] >> (7 - i % 8) & 1 == 1;
            cell.fill(LEVELS[usize::from(bit)]);
        }
        line[per_row * CELL..].fill(LEVELS[0]);
    }
    text(y, w, top + 3, stamp);
}

/// Reads the stamp back from a luma plane of `width` × `height` with rows `stride` bytes apart.
///
/// Returns `None` if the plane is too small or the cells fail their CRC.
pub fn read_stamp(luma: &[u8], stride: usize, width: usize, height: usize) -> Option<Stamp> {
    if !fits(width, height) || stride < width || luma.len() < stride * (height - 1) + width {
        return None;
    }
    let per_row = width / CELL;
    let mut bytes = [0u8; 13];
    for i in 0..STAMP_BITS {
        let (cy, cx) = (i / per_row * CELL, i % per_row * CELL);
        let mut sum = 0u32;
        for row in cy + 2..cy + CELL - 2 {
            for x in cx + 2..cx + CELL - 2 {
                sum += u32::from(luma[row * stride + x]);
            }
        }
        let mean = sum / ((CELL as u32 - 4) * (CELL as u32 - 4));
        if mean > 125 {
            bytes[i / 8] |= 1 << (7 - i % 8);
        }
    }
    if crc8(&bytes[..12]) != bytes[12] {
        return None;
    }
    let frame = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let mut t = [0u8; 8];
    t.copy_from_slice(&bytes[4..12]);
    Some(Stamp {
        frame,
        time_us: u64::from_be_bytes(t),
    })
}

/// 3 × 5 glyphs, a row per entry, high bit left: `0`–`9`, `:`, `.`, `#`.
const FONT: [[u8; 5]; 13] = [
    [7, 5, 5, 5, 7],
    [2, 6, 2, 2, 7],
    [7, 1, 7, 4, 7],
    [7, 1, 7, 1, 7],
    [5, 5, 7, 1, 1],
    [7, 4, 7, 1, 7],
    [7, 4, 7, 5, 7],
    [7, 1, 1, 1, 1],
    [7, 5, 7, 5, 7],
    [7, 5, 7, 1, 7],
    [0, 2, 0, 2, 0],
    [0, 0, 0, 0, 2],
    [5, 7, 5, 7, 5],
];

/// Prints `#NNNNNN HH:MM:SS.mmm` (UTC) in white, glyphs doubled, at row `top`.
fn text(y: &mut [u8], w: usize, top: usize, stamp: Stamp) {
    let ms = stamp.time_us / 1000;
    let day = ms % 86_400_000;
    let (hh, mm, ss, mmm) = (
        day / 3_600_000,
        day / 60_000 % 60,
        day / 1000 % 60,
        day % 1000,
    );
    let mut glyphs = [None; 20];
    let mut at = 0;
    let mut put = |g: Option<usize>| {
        if at < glyphs.len() {
            glyphs[at] = g;
            at += 1;
        }
    };
    put(Some(12));
    let f = u64::from(stamp.frame) % 1_000_000;
    for d in (0..6).rev() {
        put(Some((f / 10u64.pow(d) % 10) as usize));
    }
    put(None);
    for (v, digits, sep) in [(hh, 2, 10), (mm, 2, 10), (ss, 2, 11), (mmm, 3, 99)] {
        for d in (0..digits).rev() {
            put(Some((v / 10u64.pow(d) % 10) as usize));
        }
        if sep != 99 {
            put(Some(sep));
        }
    }
    for (k, g) in glyphs.iter().enumerate() {
        let Some(g) = g else { continue };
        let x0 = 4 + k * 8;
        if x0 + 6 > w {
            break;
        }
        for (r, bits) in FONT[*g].iter().enumerate() {
            for c in 0..3 {
                if bits >> (2 - c) & 1 == 1 {
                    for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                        y[(top + 2 * r + dy) * w + x0 + 2 * c + dx] = 235;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_read_back_from_the_raw_picture() {
        for (w, h) in [(320, 240), (128, 96), (160, 120), (642, 362)] {
            let mut pic = Picture::new(w, h);
            for frame in [0, 1, 77, u32::MAX] {
                let s = Stamp {
                    frame,
                    time_us: 1_764_000_000_123_456 + u64::from(frame),
                };
                draw(&mut pic, s);
                assert_eq!(read_stamp(pic.luma(), w, w, h), Some(s), "{w}x{h}");
            }
        }
    }

    #[test]
    fn frames_differ_and_a_damaged_stamp_is_refused() {
        let mut a = Picture::new(320, 240);
        let mut b = Picture::new(320, 240);
        draw(
            &mut a,
            Stamp {
                frame: 3,
                time_us: 9,
            },
        );
        draw(
            &mut b,
            Stamp {
                frame: 4,
                time_us: 9,
            },
        );
        assert_ne!(a, b);
        let (y, _, _) = a.planes_mut();
        for px in &mut y[..CELL * 2] {
            *px = 255 - *px;
        }
        for row in 0..CELL {
            for x in 0..CELL {
                y[row * 320 + x] = 255 - y[row * 320 + x];
            }
        }
        assert_eq!(read_stamp(a.luma(), 320, 320, 240), None);
        assert_eq!(read_stamp(&[0; 10], 320, 320, 240), None);
        assert_eq!(read_stamp(a.luma(), 320, 64, 48), None);
    }
}
