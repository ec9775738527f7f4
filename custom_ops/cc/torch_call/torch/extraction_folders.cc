// The folders AOTInductor unpacks packages into, and their cleanup (extraction_folders.h).
#include "custom_ops/cc/torch_call/torch/extraction_folders.h"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>

namespace xgr {
namespace torch_call {
namespace {

constexpr char kArchiveMark[] = "/data/aotinductor/";
constexpr char kOwnerFile[] = "xgr_torch_call.owner";

// A process's start time (field 22 of /proc/PID/stat), empty when there is no such process:
// with the pid it names a process even after the pid is reused.
std::string ProcessStart(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return "";
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
  }
  return field;
}

std::string OwnerText() {
  const long pid = static_cast<long>(::getpid());
  return std::to_string(pid) + " " + ProcessStart(pid);
}

bool OwnerAlive(const std::filesystem::path& owner_file) {
  std::ifstream in(owner_file);
  long pid = 0;
  std::string start;
  if (!(in >> pid >> start) || pid <= 0) return false;
  return ProcessStart(pid) == start;
}

// The temporary directories torch unpacks into (torch 2.13 honours TMPDIR, 2.11 uses /tmp).
std::set<std::filesystem::path> TempRoots() {
  std::error_code ec;
  std::set<std::filesystem::path> roots{"/tmp"};
  const auto temp = std::filesystem::temp_directory_path(ec);
  if (!ec) roots.insert(std::filesystem::weakly_canonical(temp, ec));
  return roots;
}

class ExtractionFolders {
 public:
  void Add(const std::filesystem::path& folder) {
    std::lock_guard<std::mutex> lock(mu_);
    folders_.insert(folder);
  }
  // At process exit: plain file removal, no torch call (CUDA may be torn down by then).
  ~ExtractionFolders() {
    for (const auto& folder : folders_) {
      std::error_code ec;
      std::filesystem::remove_all(folder, ec);
    }
  }

 private:
  std::mutex mu_;
  std::set<std::filesystem::path> folders_;
};

ExtractionFolders& Extractions() {
  static ExtractionFolders folders;  // destroyed at exit, after the last kernel returned
  return folders;
}

}  // namespace

// The folders holding unpacked archives that this process maps libraries from:
// <folder>/<archive>/data/aotinductor/<model>/<name>.wrapper.so -> <folder>.
std::set<std::filesystem::path> MappedExtractions() {
  std::set<std::filesystem::path> folders;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto mark = line.find(kArchiveMark);
    const auto start = line.find('/');  // the path field: the other fields hold no '/'
    if (mark == std::string::npos || start == std::string::npos || start > mark) continue;
    folders.insert(std::filesystem::path(line.substr(start, mark - start)).parent_path());
  }
  return folders;
}

// Records the folders torch unpacked `package` into since `before`: only folders directly in
// a temporary directory (torch 2.13 honours TMPDIR, 2.11 uses /tmp) and not holding the
// package itself (an unpacked package is loaded where it lies).
void RecordExtractions(const std::set<std::filesystem::path>& before, const std::string& package) {
  std::error_code ec;
  const auto roots = TempRoots();
  const std::string source = std::filesystem::weakly_canonical(package, ec).string();
  for (const auto& folder : MappedExtractions()) {
    if (before.count(folder) || !roots.count(folder.parent_path())) continue;
    if (source.rfind(folder.string() + "/", 0) == 0) continue;
    Extractions().Add(folder);
    std::ofstream(folder / kOwnerFile) << OwnerText() << "\n";
  }
}

// Once per process, before its first load: the folders of processes that died holding them.
void RemoveStaleExtractions() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const auto& root : TempRoots()) {
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
        std::error_code entry_ec;
        const auto owner = entry.path() / kOwnerFile;
        if (!entry.is_directory(entry_ec) || !std::filesystem::exists(owner, entry_ec)) continue;
        if (!OwnerAlive(owner)) std::filesystem::remove_all(entry.path(), entry_ec);
      }
    }
  });
}

}  // namespace torch_call
}  // namespace xgr
