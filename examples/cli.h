#pragma once

// What the examples' command lines (CLI11) check beyond CLI11's own
// validators: a LibTorch device name, a count of at least one, a tolerance.

#include <CLI/CLI.hpp>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <string>

namespace examples {

/// "cpu", "cuda", "cuda:1": what torch::Device accepts.
inline const CLI::Validator kDevice(
    [](const std::string& name) -> std::string {
      try {
        c10::Device device(name);
        (void)device;
        return "";
      } catch (const c10::Error&) {
        return "not a device: " + name + " (cpu, cuda, cuda:N)";
      }
    },
    "DEVICE");

/// An integer of at least 1.
inline const CLI::Validator kCount(
    [](const std::string& value) -> std::string {
      try {
        size_t used = 0;
        if (std::stoll(value, &used) >= 1 && used == value.size()) return "";
      } catch (const std::exception&) {
      }
      return "must be a whole number of at least 1, got " + value;
    },
    "COUNT");

/// A finite number of at least 0 (a tolerance: NaN would accept everything).
inline const CLI::Validator kTolerance(
    [](const std::string& value) -> std::string {
      try {
        size_t used = 0;
        const double v = std::stod(value, &used);
        if (used == value.size() && std::isfinite(v) && v >= 0) return "";
      } catch (const std::exception&) {
      }
      return "must be a finite number of at least 0, got " + value;
    },
    "TOLERANCE");

}  // namespace examples
