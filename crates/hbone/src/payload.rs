//! Buffers for DATA payloads that the TLS layer will copy without hitting `rep movsb`'s slow
//! path.

use bytes::{Buf, BufMut, BytesMut};

/// Where the payload of a bulk buffer starts, counted from the start of its allocation.
///
/// Why not at 0: rustls copies each DATA payload into a fresh TLS record buffer, just after
/// the 5-byte record header and the 9-byte HTTP/2 frame header. The allocator hands out both
/// buffers page-aligned, so the destination of that copy sits 14 bytes past its source
/// modulo 4 KiB, and `rep movsb` (glibc's memcpy at these sizes) slows down about twentyfold
/// when the destination is 1-31 bytes ahead of the source within the page ("4K aliasing").
/// It cost the sending node proxy a quarter of its CPU. A quarter page keeps that distance
/// clear whatever the record buffer's alignment.
const PAYLOAD_OFFSET: usize = 1024;

/// Buffers at least this large get [`PAYLOAD_OFFSET`]: glibc's memcpy switches to `rep movsb`
/// from 2 KiB (SSE2) to 8 KiB (AVX-512) upward. Smaller payloads are copied by vector loops,
/// which do not care, and a quarter page of padding would outweigh them.
const OFFSET_FROM: usize = 2 * 1024;

/// An empty buffer with room for `capacity` payload bytes, placed as [`PAYLOAD_OFFSET`] says.
pub(crate) fn payload_buffer(capacity: usize) -> BytesMut {
    if capacity < OFFSET_FROM {
        return BytesMut::with_capacity(capacity);
    }
    let mut buf = BytesMut::with_capacity(PAYLOAD_OFFSET + capacity);
    buf.put_bytes(0, PAYLOAD_OFFSET);
    buf.advance(PAYLOAD_OFFSET);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_buffers_from_2_kib_start_a_quarter_page_into_their_allocation() {
        for capacity in [OFFSET_FROM, 8 * 1024, 256 * 1024] {
            let mut buf = payload_buffer(capacity);
            assert!(buf.is_empty());
            assert!(buf.capacity() >= capacity, "room for a whole read");
            let payload_start = buf.as_ptr() as usize;
            // Reclaiming the skipped front moves the start back to the allocation's first byte.
            assert!(buf.try_reclaim(PAYLOAD_OFFSET + capacity));
            assert_eq!(payload_start - buf.as_ptr() as usize, PAYLOAD_OFFSET);
        }
    }

    #[test]
    fn small_payload_buffers_are_not_offset() {
        let mut buf = payload_buffer(1024);
        let start = buf.as_ptr() as usize;
        assert!(buf.capacity() >= 1024);
        assert!(buf.try_reclaim(1024));
        assert_eq!(buf.as_ptr() as usize, start);
    }
}
