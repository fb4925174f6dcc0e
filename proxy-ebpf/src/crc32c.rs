//! SCTP's checksum (CRC32c, RFC 9260 appendix A) kept right when a port
//! changes, without reading the packet: a CRC is linear, so for two
//! messages of one length `crc(a) ^ crc(b)` is the CRC (with no initial
//! value and no final xor) of `a ^ b`, here the port's change followed by
//! zeros. That CRC is the change times `x^(8 * length)` modulo the
//! polynomial, two multiplications however long the packet is (zlib's
//! `crc32_combine` does the same). Addresses are not covered:
//! SCTP's checksum has no pseudo-header.
use crate::{
    access::repeat,
    frame::Frame,
    packet::{ETH_HLEN, Family, RewriteFailed},
};

/// CRC32c's polynomial, bit-reflected.
const POLY: u32 = 0x82f6_3b78;

/// `x^(8 * i)` and `x^(8 * 256 * i)` modulo the polynomial for `i` below
/// 256, made at compile time: a length's power is one product of two of
/// them, so a packet costs two multiplications however long it is.
static LOW: [u32; 256] = powers(1);
static HIGH: [u32; 256] = powers(256);

/// `x^(8 * step * i)` for `i` below 256.
const fn powers(step: u32) -> [u32; 256] {
    let mut x_8step = 1u32 << 31;
    let mut j = 0;
    while j < 8 * step {
        x_8step = mul(x_8step, 1 << 30);
        j += 1;
    }
    let mut out = [0u32; 256];
    out[0] = 1 << 31;
    let mut i = 1;
    while i < 256 {
        out[i] = mul(out[i - 1], x_8step);
        i += 1;
    }
    out
}

/// Offset of the checksum in the SCTP common header.
const CHECKSUM: usize = 8;

/// All ones when bit 0 of `bit` is set, else 0: a choice without a
/// branch (a branch per bit doubles what the verifier explores).
#[inline(always)]
const fn mask(bit: u32) -> u32 {
    (bit & 1).wrapping_neg()
}

/// `a * b` modulo the polynomial (bit-reflected: bit 31 is `x^0`), at
/// compile time (the tables above).
const fn mul(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut i = 0;
    while i < 32 {
        product ^= b & mask(a >> (31 - i));
        b = (b >> 1) ^ (POLY & mask(b));
        i += 1;
    }
    product
}

/// A multiplication in progress, one bit of `a` a step (`mul_step`).
#[repr(C)]
struct Multiplication {
    a: u32,
    b: u32,
    product: u32,
}

/// Step `i` of `a * b`: the verifier checks it once (`repeat`), where the
/// 32 steps inline were walked at every call site of every program (over
/// the million instructions it allows `nodeport_ingress`).
extern "C" fn mul_step(i: u64, p: *mut Multiplication) -> i64 {
    // SAFETY: `repeat` passes the `Multiplication` it was given.
    let p = unsafe { &mut *p };
    #[expect(clippy::cast_possible_truncation, reason = "below 32")]
    let bit = 31u32.wrapping_sub(i as u32) & 31;
    p.product ^= p.b & mask(p.a >> bit);
    p.b = (p.b >> 1) ^ (POLY & mask(p.b));
    0
}

/// `a * b` modulo the polynomial, in the programs.
#[inline(always)]
fn mul_run(a: u32, b: u32) -> u32 {
    let mut p = Multiplication { a, b, product: 0 };
    repeat(32, mul_step, &mut p);
    p.product
}

/// `x^(8 * len)` modulo the polynomial.
#[inline(always)]
fn x_pow_bytes(len: u16) -> u32 {
    let [low, high] = len.to_le_bytes();
    mul_run(LOW[usize::from(low)], HIGH[usize::from(high)])
}

/// Updates the SCTP checksum of a packet (its SCTP header at `l4`) for
/// its source (`src`) or destination port changing by `xor` (old ^ new,
/// network order).
#[inline(always)]
pub fn port_changed<F: Frame + ?Sized>(
    ctx: &F,
    family: Family,
    l4: usize,
    src: bool,
    xor: u16,
) -> Result<(), RewriteFailed> {
    let l3 = ETH_HLEN;
    if l4 < l3 + 20 {
        return Err(RewriteFailed);
    }
    // The SCTP packet's length: what the IP header says is after it.
    let len = match family {
        Family::V4 => {
            let total = u16::from_be(ctx.load::<u16>(l3 + 2)?);
            #[expect(clippy::cast_possible_truncation, reason = "an IPv4 header is at most 60 bytes")]
            let header = (l4 - l3) as u16;
            total.checked_sub(header).ok_or(RewriteFailed)?
        }
        Family::V6 => {
            // The payload length counts extension headers (DSR's) too.
            let payload = u16::from_be(ctx.load::<u16>(l3 + 4)?);
            #[expect(clippy::cast_possible_truncation, reason = "one extension header of 24 bytes at most")]
            let extensions = l4.checked_sub(l3 + 40).ok_or(RewriteFailed)? as u16;
            payload.checked_sub(extensions).ok_or(RewriteFailed)?
        }
    };
    // The change as the message's first four bytes, read as the CRC's
    // register takes them (little-endian).
    let b = xor.to_ne_bytes();
    let change = if src { [b[0], b[1], 0, 0] } else { [0, 0, b[0], b[1]] };
    let delta = mul_run(x_pow_bytes(len), u32::from_le_bytes(change));
    // The checksum is stored as the CRC's little-endian bytes.
    let old: [u8; 4] = ctx.load(l4 + CHECKSUM)?;
    let new = (u32::from_le_bytes(old) ^ delta).to_le_bytes();
    ctx.store(l4 + CHECKSUM, &new)
}
