/* C ABI over concord's numerics, for ctypes: the Python reference tests (tests/python/) call it.
 *
 * Conventions
 *   - Every function that can fail returns int32_t status: 0 on success, nonzero on error; the
 *     message is then in concord_last_error() (per thread, valid until the next failing call).
 *   - Ids are the stable enum numbers of numerics: format (format.h: f32=0, bf16=1, fp16=2,
 *     e4m3=3, e5m2=4, e2m3=5, e3m2=6, e2m1=7, e8m0=8, ue4m3=9, int8=10, int4=11), rounding
 *     (rne=0, rtz=1, stochastic=2), overflow (saturate=0, ieee=1), scale rule (floor=0, ceil=1,
 *     even=2, rceil=3).
 *   - Element codes cross the ABI as uint32 arrays, right-aligned (as encode_ref returns them).
 *     Block results also come as the packed storage of block.h (16-bit formats 2 bytes LE,
 *     8/6-bit formats 1 byte, 4-bit formats two per byte with element 2k in the low nibble).
 *   - Block descriptors cross as their canonical text (QuantDesc::to_string, e.g.
 *     "element=e4m3;block=1x32;scale=e8m0;rule=floor;axis=1;rounding=rne;overflow=saturate").
 *   - Stochastic rounding: element i of an array uses Philox word first_index + i of the stream
 *     (seed, stream), exactly as quantize_ref numbers a tensor's elements (r*cols + c).
 */
#ifndef CONCORD_CAPI_H_
#define CONCORD_CAPI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a signature below changes. */
uint32_t concord_capi_version(void);
const char* concord_last_error(void);

/* Format traits: bits per code, and name ("e4m3"); name is NULL for an unknown id. */
int32_t concord_format_bits(int32_t format);
const char* concord_format_name(int32_t format);

/* encode_ref over n values; random words from Philox (seed, stream, first_index + i). */
int32_t concord_encode_ref(int32_t format, int32_t rounding, int32_t overflow, const float* x,
                           size_t n, uint64_t seed, uint32_t stream, uint64_t first_index,
                           uint32_t* codes_out);
/* encode_ref over n values with an explicit random word per value (words may be NULL when
 * rounding is not stochastic). */
int32_t concord_encode_ref_words(int32_t format, int32_t rounding, int32_t overflow,
                                 const float* x, const uint32_t* words, size_t n,
                                 uint32_t* codes_out);
/* decode_ref over n codes. */
int32_t concord_decode_ref(int32_t format, const uint32_t* codes, size_t n, float* out);
/* The Philox words of (seed, stream) for element indices first_index .. first_index + n - 1. */
int32_t concord_philox_words(uint64_t seed, uint32_t stream, uint64_t first_index, size_t n,
                             uint32_t* words_out);

/* MX scale of one block amax each: e8m0 code (0xFF = NaN) and unbiased exponent (128 = NaN). */
int32_t concord_mx_scale_code(const float* amax, size_t n, int32_t element, int32_t rule,
                              uint8_t* codes_out, int32_t* exponents_out);
/* NVFP4 (Transformer Engine): S_enc from the tensor amax, and the ue4m3 block scale code. */
int32_t concord_nvfp4_global_encode_scale(float tensor_amax, float* out);
int32_t concord_nvfp4_block_scale_code(const float* block_amax, size_t n,
                                       float global_encode_scale, uint8_t* codes_out);

/* The canonical descriptor text for a preset name ("mxfp8-e4m3", "mxfp4", "nvfp4", ...), into
 * buf (capacity cap, NUL-terminated). */
int32_t concord_quant_desc_from_name(const char* name, char* buf, size_t cap);
/* Sizes of a quantized rows x cols tensor: packed code bytes and number of block scales. */
int32_t concord_quantized_sizes(const char* desc, int64_t rows, int64_t cols,
                                size_t* code_bytes_out, size_t* scale_count_out);

/* Quantizes x (rows x cols, row-major) with quantize_ref (fast = 0) or the dispatching fast
 * path quantize() (fast != 0). Outputs (any may be NULL): codes_out (rows*cols uint32, one code
 * each), packed_out (code_bytes), scales_out (scale_count bytes), tensor_scale_out. */
int32_t concord_quantize(const char* desc, const float* x, int64_t rows, int64_t cols,
                         uint64_t seed, uint32_t stream, int32_t fast, uint32_t* codes_out,
                         uint8_t* packed_out, uint8_t* scales_out, float* tensor_scale_out);
/* Dequantizes packed codes + scales (the layout concord_quantize writes) with dequantize_ref
 * (fast = 0) or dequantize() (fast != 0) into out (rows*cols fp32). */
int32_t concord_dequantize(const char* desc, int64_t rows, int64_t cols, const uint8_t* packed,
                           const uint8_t* scales, float tensor_scale, int32_t fast, float* out);

/* GGUF (io/gguf.h), for tests/python/test_gguf_interop.py. Tensor types are ggml's numbers
 * (F32=0, F16=1, Q8_0=8, BF16=30, MXFP4=39, ...). */
/* ggml's block size and bytes per block of a type, and its name ("Q8_0"); nonzero for a type
 * number ggml does not define. */
int32_t concord_ggml_type_traits(uint32_t type, int64_t* block_size_out, int64_t* type_size_out,
                                 char* name_buf, size_t cap);
/* Encodes n fp32 values as `type` (F32, F16, BF16, Q4_0, Q4_1, Q8_0, MXFP4) into out (capacity
 * cap bytes); *out_len receives the byte count. The block types reject NaN and Inf. */
int32_t concord_gguf_encode(uint32_t type, const float* x, size_t n, uint8_t* out, size_t cap,
                            size_t* out_len);
/* Dequantizes n values of `type` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K,
 * Q8_K, MXFP4: io::gguf_tensor_to_floats) from nbytes bytes into out. */
int32_t concord_gguf_decode(uint32_t type, const uint8_t* bytes, size_t nbytes, float* out,
                            size_t n);
/* Writes a GGUF file with write_gguf. spec is JSON:
 *   {"metadata": [{"key": K, "type": T, "value": V}, ...  (T: uint8 .. float64, bool, string;
 *                  arrays: "type": "array", "element_type": T, "value": [...])],
 *    "tensors": [{"name": N, "type": ggml type number, "dims": [ne0, ...], "nbytes": B}, ...]}
 * and data holds the tensors' bytes back to back in that order. */
int32_t concord_gguf_write(const char* path, const char* spec, const uint8_t* data,
                           size_t data_len, uint32_t alignment);

/* Chat templates (serve/text.h), for tests/python/test_chat_template.py: renders one user turn
 * (and a system message when `system` is not NULL) with add_generation_prompt, as
 * `concord generate --chat` does; `enable_thinking` 0 gives Qwen3's empty <think> block. The
 * NUL-terminated text goes to out (capacity cap bytes); *out_len receives its length. */
int32_t concord_render_chat(const char* chat_template, const char* system, const char* user,
                            int32_t enable_thinking, char* out, size_t cap, size_t* out_len);
/* Multi-turn: renders the conversation messages_json, a JSON array of {"role": "system" | "user"
 * | "assistant", "content": STRING} objects, with add_generation_prompt (serve::render_chat
 * over ChatMessage). Output as concord_render_chat. */
int32_t concord_render_chat_messages(const char* chat_template, const char* messages_json,
                                     int32_t enable_thinking, char* out, size_t cap,
                                     size_t* out_len);

#ifdef __cplusplus
}
#endif

#endif /* CONCORD_CAPI_H_ */
