// Internal declarations shared by the translation units of mycroft_otel._native.
//
//   module.cc  numpy dtypes derived from the shm_layout.h / driver_event.h structs, name tables, constants
//   reader.cc  RingReader: read-only view of one plugin context's shared-memory file
//   driver.cc  Driver: loads a profiler plugin .so and calls its ABI exactly as NCCL does
//   otlp.cc    ExportDecoder / AttrDecoder: OTLP trace payloads read straight from the wire (processor ingest)
//   rules.cc   FlowRule: the agent's local rule on a completed op's flow counters (its poll loop)
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <ctime>

namespace mycroft::bindings {

namespace py = pybind11;

void RegisterReader(py::module_& m);
void RegisterDriver(py::module_& m);
void RegisterOtlp(py::module_& m);
void RegisterRules(py::module_& m);

inline uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

}  // namespace mycroft::bindings
