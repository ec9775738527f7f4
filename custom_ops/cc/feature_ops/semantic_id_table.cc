// The semantic-ID catalog: building, the catalog file reader and the TF resource.
#include "custom_ops/cc/feature_ops/semantic_id_table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/platform/env.h"

namespace xgr {

int64_t SemanticIdCatalog::Find(int64_t item) const {
  const auto it = std::lower_bound(sorted_ids.begin(), sorted_ids.end(), item);
  if (it == sorted_ids.end() || *it != item) return -1;
  return static_cast<int64_t>(it - sorted_ids.begin());
}

namespace {

template <typename CodeT>
absl::Status BuildCatalogImpl(const int64_t* ids, const CodeT* codes, int64_t num_items,
                              int64_t levels, int64_t codebook_size, const std::string& source,
                              std::shared_ptr<const SemanticIdCatalog>* out) {
  if (levels < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": levels must be >= 1, got ", levels));
  }
  if (codebook_size < 1 || codebook_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": codebook_size must lie in [1, 2^31 - 1], got ", codebook_size));
  }
  for (int64_t i = 0; i < num_items * levels; ++i) {
    if (codes[i] < 0 || static_cast<int64_t>(codes[i]) >= codebook_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": codes must lie in [0, codebook_size=", codebook_size, "), got ",
          static_cast<int64_t>(codes[i]), " for item ", ids[i / levels], " at level ",
          i % levels));
    }
  }
  // Sort (id, source row) pairs: contiguous keys sort several times faster than a
  // permutation compared through the ids; the codes then follow in one gather.
  std::vector<std::pair<int64_t, int64_t>> order(num_items);
  for (int64_t i = 0; i < num_items; ++i) order[i] = {ids[i], i};
  std::sort(order.begin(), order.end());
  auto catalog = std::make_shared<SemanticIdCatalog>();
  catalog->levels = levels;
  catalog->codebook_size = codebook_size;
  catalog->sorted_ids.resize(num_items);
  catalog->codes.resize(num_items * levels);
  for (int64_t r = 0; r < num_items; ++r) {
    const int64_t src = order[r].second;
    catalog->sorted_ids[r] = order[r].first;
    if (r > 0 && catalog->sorted_ids[r] == catalog->sorted_ids[r - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": item ids must be unique, item ", ids[src], " appears twice"));
    }
    for (int64_t l = 0; l < levels; ++l) {
      catalog->codes[r * levels + l] = static_cast<int32_t>(codes[src * levels + l]);
    }
  }
  *out = std::move(catalog);
  return absl::OkStatus();
}

// Header of the catalog file: magic, then int64 num_items, levels, codebook_size
// (little-endian), followed by ids int64 [N] and codes int32 [N, levels].
constexpr char kMagic[8] = {'X', 'G', 'R', 'S', 'I', 'D', '0', '1'};
constexpr int64_t kHeaderBytes = 32;

absl::Status ReadExactly(const tensorflow::RandomAccessFile& file, uint64_t offset,
                         uint64_t bytes, char* dst, const std::string& path) {
  constexpr uint64_t kChunk = 64 << 20;  // some file systems cap one read
  while (bytes > 0) {
    const uint64_t n = std::min(bytes, kChunk);
    absl::string_view got;
    absl::Status s = file.Read(offset, got, absl::MakeSpan(dst, n));
    if (!s.ok() && !absl::IsOutOfRange(s)) return s;
    if (got.size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "catalog file ", path, " is truncated: wanted ", n, " bytes at offset ", offset,
          ", got ", got.size()));
    }
    if (got.data() != dst) std::memcpy(dst, got.data(), n);
    offset += n;
    bytes -= n;
    dst += n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BuildCatalog(const int64_t* ids, const int64_t* codes, int64_t num_items,
                          int64_t levels, int64_t codebook_size, const std::string& source,
                          std::shared_ptr<const SemanticIdCatalog>* out) {
  return BuildCatalogImpl(ids, codes, num_items, levels, codebook_size, source, out);
}

absl::Status BuildCatalog(const int64_t* ids, const int32_t* codes, int64_t num_items,
                          int64_t levels, int64_t codebook_size, const std::string& source,
                          std::shared_ptr<const SemanticIdCatalog>* out) {
  return BuildCatalogImpl(ids, codes, num_items, levels, codebook_size, source, out);
}

absl::Status ReadCatalogFile(const std::string& path, int64_t levels, int64_t codebook_size,
                             std::shared_ptr<const SemanticIdCatalog>* out) {
  tensorflow::Env* env = tensorflow::Env::Default();
  uint64_t file_size = 0;
  TF_RETURN_IF_ERROR(env->GetFileSize(path, &file_size));
  std::unique_ptr<tensorflow::RandomAccessFile> file;
  TF_RETURN_IF_ERROR(env->NewRandomAccessFile(path, &file));
  if (file_size < static_cast<uint64_t>(kHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "catalog file ", path, " has ", file_size, " bytes, fewer than its 32-byte header"));
  }
  char header[kHeaderBytes];
  TF_RETURN_IF_ERROR(ReadExactly(*file, 0, kHeaderBytes, header, path));
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("catalog file ", path, " does not start with the magic XGRSID01"));
  }
  int64_t fields[3];
  std::memcpy(fields, header + 8, sizeof(fields));
  const int64_t num_items = fields[0];
  if (fields[1] != levels || fields[2] != codebook_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "catalog file ", path, " holds levels=", fields[1], ", codebook_size=", fields[2],
        " but the table was declared with levels=", levels, ", codebook_size=",
        codebook_size));
  }
  // Every size below is bounded by the file size, so none of the products can overflow.
  const uint64_t row_bytes = 8 + 4 * static_cast<uint64_t>(levels);
  if (num_items < 0 || levels < 1 ||
      static_cast<uint64_t>(num_items) > (file_size - kHeaderBytes) / row_bytes ||
      file_size != kHeaderBytes + static_cast<uint64_t>(num_items) * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "catalog file ", path, " has ", file_size, " bytes; its header announces ", num_items,
        " items of ", levels, " levels, which needs 32 + N * (8 + 4 * levels) bytes"));
  }
  std::vector<int64_t> ids(num_items);
  std::vector<int32_t> codes(num_items * levels);
  TF_RETURN_IF_ERROR(ReadExactly(*file, kHeaderBytes, num_items * 8,
                                 reinterpret_cast<char*>(ids.data()), path));
  TF_RETURN_IF_ERROR(ReadExactly(*file, kHeaderBytes + num_items * 8, codes.size() * 4,
                                 reinterpret_cast<char*>(codes.data()), path));
  return BuildCatalog(ids.data(), codes.data(), num_items, levels, codebook_size,
                      absl::StrCat("catalog file ", path), out);
}

std::string SemanticIdTableResource::DebugString() const {
  const auto c = catalog();
  if (c == nullptr) return "SemanticIdTable(uninitialized)";
  return absl::StrCat("SemanticIdTable(items=", c->sorted_ids.size(), ", levels=", c->levels,
                      ", codebook_size=", c->codebook_size, ")");
}

std::shared_ptr<const SemanticIdCatalog> SemanticIdTableResource::catalog() const {
  absl::MutexLock lock(&mu_);
  return catalog_;
}

void SemanticIdTableResource::set_catalog(std::shared_ptr<const SemanticIdCatalog> catalog) {
  absl::MutexLock lock(&mu_);
  catalog_ = std::move(catalog);
}

}  // namespace xgr
