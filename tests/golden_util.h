// The text format shared by the golden-vector files in DETOPS_GOLDEN_DIR (written by
// scripts/gen_golden_*.py; see their docstrings), and one parser for it:
//
//     # a comment line
//     case <name> <key>=<value> ...      a case: its name and header fields
//     <label> <count>                    an array: then `count` whitespace-separated numbers,
//     v v v ...                          on the following lines (the generators write one row of
//     ...                                the last dimension per line)
//     end                                closes the case
//
// parse_golden_records reads a file into GoldenRecords (fields as strings, arrays by label);
// load_golden turns each into a test's own case type with a converter that checks the fields it
// knows and the arrays it needs. Header-only; tests only.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace detops {
namespace test {

/// One `case ... end` block as read: header fields in file order, arrays by label.
struct GoldenRecord {
  std::string name;
  std::vector<std::pair<std::string, std::string>> fields;  // key=value
  std::map<std::string, std::vector<double>> arrays;

  /// Whether array `label` is there with exactly `count` values.
  bool has(const std::string& label, std::int64_t count) const {
    const auto it = arrays.find(label);
    return it != arrays.end() && static_cast<std::int64_t>(it->second.size()) == count;
  }

  /// "" when every label of `labels` is there with `count` values, otherwise
  /// "<case>: missing or short <label>" for the first that is not.
  template <class Labels>
  std::string need(const Labels& labels, std::int64_t count) const {
    for (const auto& k : labels)
      if (!has(k, count)) return name + ": missing or short " + std::string(k);
    return "";
  }
};

inline std::int64_t golden_int(const std::string& v) { return std::strtoll(v.c_str(), nullptr, 10); }
inline double golden_double(const std::string& v) { return std::strtod(v.c_str(), nullptr); }

/// Header field k=v when it is one of N, C, H, W (the input's shape, in every file): stores it, true.
inline bool golden_nchw_field(const std::string& k, const std::string& v, std::int64_t* N, std::int64_t* C,
                              std::int64_t* H, std::int64_t* W) {
  std::int64_t* dst = k == "N" ? N : k == "C" ? C : k == "H" ? H : k == "W" ? W : nullptr;
  if (dst != nullptr) *dst = golden_int(v);
  return dst != nullptr;
}

/// Reads `path` into `records`; returns "" on success, otherwise why not (and leaves no records).
/// `generator` names the script that writes the file, for the message when it is missing.
inline std::string parse_golden_records(const std::string& path, const std::string& generator,
                                        std::vector<GoldenRecord>* records) {
  records->clear();
  std::ifstream in(path);
  if (!in) return "cannot open " + path + " (run " + generator + ")";
  auto fail = [&](const std::string& why) {
    records->clear();
    return path + ": " + why;
  };
  std::string line;
  GoldenRecord* cur = nullptr;
  std::vector<double>* arr = nullptr;  // the array being read
  std::size_t want = 0;                // its count
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string head;
    ls >> head;
    if (arr != nullptr && arr->size() < want) {  // a row of values
      std::istringstream vs(line);
      std::string tok;
      while (vs >> tok) {
        char* end = nullptr;
        const double v = std::strtod(tok.c_str(), &end);
        if (end == tok.c_str() || *end != '\0') return fail("bad number '" + tok + "' in case " + cur->name);
        arr->push_back(v);
      }
      if (arr->size() > want) return fail("too many values in: " + line);
      continue;
    }
    if (head == "case") {
      records->emplace_back();
      cur = &records->back();
      arr = nullptr;  // (emplace_back may have moved the records)
      ls >> cur->name;
      std::string tok;
      while (ls >> tok) {
        const std::size_t eq = tok.find('=');
        if (eq == std::string::npos) return fail("bad field '" + tok + "'");
        cur->fields.emplace_back(tok.substr(0, eq), tok.substr(eq + 1));
      }
    } else if (head == "end") {
      if (cur == nullptr) return fail("'end' without 'case'");
      cur = nullptr;
      arr = nullptr;
    } else {
      if (cur == nullptr) return fail("array outside a case: " + line.substr(0, 80));
      long long count = -1;
      ls >> count;
      if (count < 0) return fail("array without a count: " + line);
      arr = &cur->arrays[head];
      arr->clear();
      want = static_cast<std::size_t>(count);
      arr->reserve(want);
    }
  }
  if (cur != nullptr) return fail("case " + cur->name + " has no 'end'");
  return "";
}

/// The cases of a golden file, or why there are none.
template <class Case>
struct GoldenFile {
  std::vector<Case> cases;
  std::string error;  // empty when the file parsed and every case converted
};

/// Parses `path` and converts each record with `convert(const GoldenRecord&, Case*) -> std::string`
/// ("" when the record is a valid case, otherwise why not: unknown fields, missing or short arrays).
template <class Case, class Convert>
GoldenFile<Case> load_golden(const std::string& path, const std::string& generator, Convert convert) {
  GoldenFile<Case> file;
  std::vector<GoldenRecord> records;
  file.error = parse_golden_records(path, generator, &records);
  if (!file.error.empty()) return file;
  for (const GoldenRecord& r : records) {
    Case c;
    c.name = r.name;
    const std::string why = convert(r, &c);
    if (!why.empty()) {
      file.cases.clear();
      file.error = path + ": " + why;
      return file;
    }
    file.cases.push_back(std::move(c));
  }
  return file;
}

}  // namespace test
}  // namespace detops
