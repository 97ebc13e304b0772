#include "daemon/metrics_exporter.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "daemon/config.h"
#include "prometheus/exposer.h"

namespace tier::daemon {

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(
    const std::string& address, std::shared_ptr<prometheus::Collectable> collectable) {
  if (absl::Status valid = CheckMetricsListen(address); !valid.ok()) return valid;
  if (address.empty()) return absl::InvalidArgumentError("metrics_listen is empty");
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // Two threads: a scrape and a second one (another Prometheus, a curl) at once.
    exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/2);
  } catch (const std::exception& error) {
    // civetweb says only "null context when constructing CivetServer"; the usual causes are
    // these.
    return absl::UnavailableError(absl::StrCat(
        "metrics_listen: cannot listen on ", address, " (", error.what(),
        "): is the port in use, or the address not one of this host's?"));
  }
  exposer->RegisterCollectable(collectable);
  return std::unique_ptr<MetricsExporter>(
      new MetricsExporter(address, std::move(collectable), std::move(exposer)));
}

MetricsExporter::MetricsExporter(std::string address,
                                 std::shared_ptr<prometheus::Collectable> collectable,
                                 std::unique_ptr<prometheus::Exposer> exposer)
    : address_(std::move(address)), collectable_(std::move(collectable)),
      exposer_(std::move(exposer)) {}

// The exposer stops its server (joining its threads) before the collectable goes.
MetricsExporter::~MetricsExporter() { exposer_.reset(); }

}  // namespace tier::daemon
