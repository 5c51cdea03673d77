/*
 * tests/fuzz/fuzz_segment.c - libFuzzer target for the segment header
 * reader (lms__segment_header_check), which gc, verify and the loader run on
 * the first 4096 bytes of every segment file: the file may be truncated,
 * damaged or not a segment at all.
 *
 * A header that passes must be one the encoder would write: re-encoding its
 * fields gives back the same 4096 bytes.
 */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "store/store_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* as read: exactly the bytes present (a short file gives a short header) */
    if (lms__segment_header_check(data, size, NULL, UINT32_MAX, "fuzz.seg") != 0)
        return 0;
    assert(size >= LMS__SEG_HEADER_SIZE);
    uint32_t id = lms__get_u32(data + 16);
    uint32_t align = lms__get_u32(data + 40);
    uint64_t created = lms__get_u64(data + 48);
    static uint8_t hdr[LMS__SEG_HEADER_SIZE];
    lms__segment_header_encode(hdr, id, data + 24, align, created);
    assert(memcmp(hdr, data, LMS__SEG_HEADER_SIZE) == 0);
    assert(lms__segment_header_check(data, size, data + 24, id, "fuzz.seg") == 0);
    return 0;
}
