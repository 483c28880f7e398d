#pragma once

// The zip reader of d2l::read_data_nmt (src/nmt_data.cpp): d2l's fra-eng.zip,
// stored or deflated (zlib), every offset bounds-checked.

#include <string>

namespace d2l::detail {

/// The entry ".../fra.txt" of the zip archive `bytes` read from `path`;
/// c10::Error "d2l::read_data_nmt: <path>: <what>" for anything else.
std::string read_zip_entry(const std::string& bytes, const std::string& path);

}  // namespace d2l::detail
