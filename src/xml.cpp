#include "xml.h"

#include <algorithm>
#include <array>
#include <utility>

namespace d2l::detail {
namespace {

constexpr std::array<std::pair<char, std::string_view>, 5> kXmlEntities{
    {{'&', "&amp;"}, {'<', "&lt;"}, {'>', "&gt;"}, {'"', "&quot;"}, {'\'', "&apos;"}}};

}  // namespace

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto* entity = std::find_if(kXmlEntities.begin(), kXmlEntities.end(),
                                      [c](const auto& e) { return e.first == c; });
    if (entity != kXmlEntities.end()) {
      out += entity->second;
    } else if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
      out += "\xEF\xBF\xBD";  // other control characters are not allowed in XML 1.0
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace d2l::detail
