// BLAKE2b (RFC 7693), unkeyed, with a chosen digest size: the content digest of the prompt
// cache's entries. A cryptographic hash, so a client cannot craft a prompt whose digest names
// another prompt's cached KV.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_BLAKE2B_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_BLAKE2B_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace xgr {
namespace torch_call {

class Blake2b {
 public:
  // `digest_bytes` in [1, 64].
  explicit Blake2b(size_t digest_bytes);
  void Update(const void* data, size_t size);
  // The digest of everything updated so far; the state stays usable (a copy is finalised),
  // so one running hash gives the digest of every prefix.
  std::string Digest() const;

 private:
  void Compress(bool last);

  std::array<uint64_t, 8> h_{};
  std::array<uint8_t, 128> block_{};
  size_t filled_ = 0;     // bytes in block_
  uint64_t counted_ = 0;  // bytes compressed so far (the low word of RFC 7693's counter)
  size_t digest_bytes_;
};

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_BLAKE2B_H_
