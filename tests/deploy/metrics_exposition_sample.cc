// Prints the Prometheus exposition of tests/unit/metrics_sample.h's snapshot, which holds every
// family tierd can export: the dashboard test's list of what exists beyond what a host-engine
// tierd shows in a live scrape (the GPU lanes).
#include <iostream>

#include "daemon/metrics/metrics_snapshot.h"
#include "prometheus/text_serializer.h"
#include "unit/metrics_sample.h"

int main() {
  prometheus::TextSerializer().Serialize(std::cout,
                                         tier::daemon::ToMetricFamilies(
                                             tier::daemon::SampleSnapshot()));
  return std::cout.good() ? 0 : 1;
}
