// The semantic-ID catalog: item id -> code path of `levels` codes, as a TF resource.
//
// Stored as ids sorted ascending plus their codes (row-major [N, levels] int32), searched with
// binary search: 12 bytes + 4 bytes per level per item, so a 10M-item catalog is ~200 MB and
// needs no hash-table overhead. The catalog is immutable once built; the resource holds it
// behind a shared_ptr so a re-initialisation swaps it while lookups in flight keep theirs.
#ifndef XGR_CUSTOM_OPS_FEATURE_OPS_SEMANTIC_ID_TABLE_H_
#define XGR_CUSTOM_OPS_FEATURE_OPS_SEMANTIC_ID_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/resource_base.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace xgr {

struct SemanticIdCatalog {
  int64_t levels = 0;
  int64_t codebook_size = 0;
  std::vector<int64_t> sorted_ids;  // [N], strictly increasing
  std::vector<int32_t> codes;       // [N * levels], row i belongs to sorted_ids[i]

  // Row of `item` in sorted_ids, or -1 when the item is not in the catalog.
  int64_t Find(int64_t item) const;
};

// Builds a catalog from unsorted ids [N] and codes [N * levels] (row-major). Fails on duplicate
// ids and on codes outside [0, codebook_size). `source` names the input in error messages.
absl::Status BuildCatalog(const int64_t* ids, const int64_t* codes, int64_t num_items,
                          int64_t levels, int64_t codebook_size, const std::string& source,
                          std::shared_ptr<const SemanticIdCatalog>* out);
absl::Status BuildCatalog(const int64_t* ids, const int32_t* codes, int64_t num_items,
                          int64_t levels, int64_t codebook_size, const std::string& source,
                          std::shared_ptr<const SemanticIdCatalog>* out);

// Reads a catalog file (format in custom_ops/catalog_file.py) through TF's file systems.
// `levels` and `codebook_size` must match the file's header.
absl::Status ReadCatalogFile(const std::string& path, int64_t levels, int64_t codebook_size,
                             std::shared_ptr<const SemanticIdCatalog>* out);

class SemanticIdTableResource : public tensorflow::ResourceBase {
 public:
  std::string DebugString() const override;

  // The current catalog, or nullptr before initialisation.
  std::shared_ptr<const SemanticIdCatalog> catalog() const;
  void set_catalog(std::shared_ptr<const SemanticIdCatalog> catalog);

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<const SemanticIdCatalog> catalog_ ABSL_GUARDED_BY(mu_);
};

}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_FEATURE_OPS_SEMANTIC_ID_TABLE_H_
