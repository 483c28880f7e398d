// The SVG checks of xml_helpers.h, with libxml2 as the XML parser: written
// apart from the library's own UTF-8 handling (src/viz/svg.cpp), so that a
// mistake there cannot hide itself.

#include "xml_helpers.h"

#include <libxml/parser.h>
#include <libxml/tree.h>

#include <cctype>
#include <limits>
#include <memory>
#include <set>
#include <string>

namespace d2l::testing {
namespace {

bool word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-';
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string as_string(const xmlChar* s) {
  return s == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(s));
}

// Text of elements whose class says the user wrote it.
bool user_text(xmlNode* element) {
  static const std::set<std::string> classes = {"title", "xlabel", "ylabel", "label", "entry"};
  xmlChar* cls = xmlGetProp(element, reinterpret_cast<const xmlChar*>("class"));
  const bool user = classes.count(as_string(cls)) > 0;
  xmlFree(cls);
  return user;
}

std::string check_tree(xmlNode* node, bool in_user_text) {
  for (; node != nullptr; node = node->next) {
    if (node->type == XML_TEXT_NODE || node->type == XML_CDATA_SECTION_NODE) {
      if (in_user_text) continue;
      xmlChar* content = xmlNodeGetContent(node);
      const auto problem = non_finite_problem(as_string(content));
      xmlFree(content);
      if (!problem.empty()) return "text: " + problem;
      continue;
    }
    if (node->type != XML_ELEMENT_NODE) continue;
    for (xmlAttr* a = node->properties; a != nullptr; a = a->next) {
      xmlChar* value = xmlNodeListGetString(node->doc, a->children, 1);
      const auto problem = non_finite_problem(as_string(value));
      xmlFree(value);
      if (!problem.empty()) return "attribute " + as_string(a->name) + ": " + problem;
    }
    const auto problem = check_tree(node->children, in_user_text || user_text(node));
    if (!problem.empty()) return problem;
  }
  return "";
}

}  // namespace

std::string utf8_problem(std::string_view text) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  for (size_t i = 0; i < text.size();) {
    const unsigned char b = byte(i);
    size_t n = 0;
    unsigned int c = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      n = 2, c = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      n = 3, c = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      n = 4, c = b & 0x07;
    } else {
      return "bad lead byte at " + std::to_string(i);
    }
    if (i + n > text.size()) return "truncated sequence at " + std::to_string(i);
    for (size_t k = 1; k < n; ++k) {
      if ((byte(i + k) & 0xC0) != 0x80) return "bad continuation at " + std::to_string(i + k);
      c = (c << 6) | (byte(i + k) & 0x3F);
    }
    const unsigned int least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < least[n]) return "overlong sequence at " + std::to_string(i);
    if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
      return "invalid code point at " + std::to_string(i);
    }
    i += n;
  }
  return "";
}

std::string non_finite_problem(std::string_view text) {
  const std::string low = lower(text);
  for (const char* token : {"nan", "inf"}) {
    for (size_t i = low.find(token); i != std::string::npos; i = low.find(token, i + 1)) {
      if (i + 3 < low.size() && word_char(low[i + 3])) continue;
      size_t start = i;
      if (start > 0 && (low[start - 1] == '-' || low[start - 1] == '+')) --start;
      if (start > 0 && word_char(low[start - 1])) continue;
      const size_t from = i < 20 ? 0 : i - 20;
      return "'" + std::string(text.substr(i, 3)) + "' in '" + std::string(text.substr(from, 43)) +
             "'";
    }
  }
  return "";
}

std::string svg_problem(std::string_view svg) {
  if (auto problem = utf8_problem(svg); !problem.empty()) return "not UTF-8: " + problem;
  const std::unique_ptr<xmlDoc, decltype(&xmlFreeDoc)> doc(
      xmlReadMemory(svg.data(), static_cast<int>(svg.size()), "figure.svg", "UTF-8",
                    XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING),
      &xmlFreeDoc);
  if (!doc) {
    const xmlError* error = xmlGetLastError();
    return "not well-formed XML: " + (error != nullptr && error->message != nullptr
                                          ? std::string(error->message)
                                          : std::string("(no message)"));
  }
  xmlNode* root = xmlDocGetRootElement(doc.get());
  if (root == nullptr || as_string(root->name) != "svg") return "the root is not <svg>";
  if (auto problem = check_tree(root, false); !problem.empty()) {
    return "a non-finite number: " + problem;
  }
  return "";
}

const std::vector<double>& hostile_doubles() {
  using Limits = std::numeric_limits<double>;
  constexpr double kEps = Limits::epsilon();
  static const std::vector<double> doubles = {Limits::quiet_NaN(),
                                              Limits::infinity(),
                                              -Limits::infinity(),
                                              0.0,
                                              -0.0,
                                              Limits::denorm_min(),
                                              -Limits::denorm_min(),
                                              Limits::min(),
                                              Limits::max(),
                                              Limits::lowest(),
                                              1e308,
                                              -1e308,
                                              1e300,
                                              -1e300,
                                              1e-300,
                                              1e-310,
                                              1.0,
                                              -1.0,
                                              1 + kEps,
                                              1 - kEps / 2,
                                              1e17,
                                              1e17 + 16,
                                              -1e20,
                                              0.5,
                                              3.0};
  return doubles;
}

}  // namespace d2l::testing
