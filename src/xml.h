#pragma once

// Text for SVG documents (the heatmaps and the line plots).

#include <string>
#include <string_view>

namespace d2l::detail {

/// `text` as XML character data or attribute value: the five special
/// characters as entities, control characters that XML 1.0 forbids as U+FFFD.
std::string xml_escape(std::string_view text);

}  // namespace d2l::detail
