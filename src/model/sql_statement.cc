#include "model/sql_statement.h"

#include <algorithm>
#include <cctype>

namespace waystone {
namespace {

bool IdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_'; }
bool IdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Where a `$tag$` dollar quote that opens at `at` ends (just past its closing tag),
// or npos when `at` opens none.
size_t DollarQuoteEnd(std::string_view text, size_t at, bool* unterminated) {
  size_t tag_end = at + 1;
  while (tag_end < text.size() && IdentChar(text[tag_end]) &&
         std::isdigit(static_cast<unsigned char>(text[at + 1])) == 0) {
    ++tag_end;
  }
  if (tag_end >= text.size() || text[tag_end] != '$') return std::string_view::npos;
  const std::string_view tag = text.substr(at, tag_end - at + 1);
  const size_t close = text.find(tag, tag_end + 1);
  if (close == std::string_view::npos) {
    *unterminated = true;
    return text.size();
  }
  return close + tag.size();
}

}  // namespace

absl::StatusOr<SqlStatement> ParseSqlStatement(std::string_view text) {
  SqlStatement out;
  out.text = std::string(text);
  if (text.find("{{") != std::string_view::npos) {
    return absl::InvalidArgumentError(
        "the statement contains a template ('{{'); values go in as :named parameters bound "
        "from 'params', never spliced into the SQL text");
  }
  std::string first_word;
  std::string previous_word;  // the last keyword or identifier seen, lower case
  bool ended = false;         // a ';' was seen: only blanks and comments may follow
  auto number_of = [&](const std::string& name) {
    auto it = std::find(out.names.begin(), out.names.end(), name);
    if (it == out.names.end()) {
      out.names.push_back(name);
      return out.names.size();
    }
    return static_cast<size_t>(it - out.names.begin()) + 1;
  };
  auto note_table = [&](std::string name) {
    if (previous_word == "from" || previous_word == "into" || previous_word == "update" ||
        previous_word == "join" || previous_word == "table") {
      if (std::find(out.tables.begin(), out.tables.end(), name) == out.tables.end()) {
        out.tables.push_back(std::move(name));
      }
    }
  };
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    const auto after_end = [&]() -> absl::Status {
      if (!ended) return absl::OkStatus();
      return absl::InvalidArgumentError(
          "the statement goes on after its ';': a sql step runs exactly one statement");
    };
    if (std::isspace(static_cast<unsigned char>(c)) != 0) {
      out.sqlite += c;
      out.postgres += c;
      ++i;
      continue;
    }
    if (c == '-' && i + 1 < text.size() && text[i + 1] == '-') {
      const size_t end = std::min(text.find('\n', i), text.size());
      out.sqlite.append(text.substr(i, end - i));
      out.postgres.append(text.substr(i, end - i));
      i = end;
      continue;
    }
    if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      const size_t close = text.find("*/", i + 2);
      if (close == std::string_view::npos) {
        return absl::InvalidArgumentError("a '/*' comment is not closed");
      }
      out.sqlite.append(text.substr(i, close + 2 - i));
      out.postgres.append(text.substr(i, close + 2 - i));
      i = close + 2;
      continue;
    }
    if (auto status = after_end(); !status.ok()) return status;
    if (c == ';') {
      ended = true;
      ++i;
      continue;
    }
    if (c == '\'' || c == '"' || c == '`') {
      size_t end = i + 1;
      while (true) {
        end = text.find(c, end);
        if (end == std::string_view::npos) {
          return absl::InvalidArgumentError(std::string("a ") + c + " quote is not closed");
        }
        if (end + 1 < text.size() && text[end + 1] == c) {  // a doubled quote stays inside
          end += 2;
          continue;
        }
        break;
      }
      const std::string_view quoted = text.substr(i, end + 1 - i);
      out.sqlite.append(quoted);
      out.postgres.append(quoted);
      if (c != '\'') note_table(std::string(quoted.substr(1, quoted.size() - 2)));
      if (first_word.empty()) first_word = "?";
      previous_word.clear();
      i = end + 1;
      continue;
    }
    if (c == '$') {
      bool unterminated = false;
      const size_t end = DollarQuoteEnd(text, i, &unterminated);
      if (unterminated) return absl::InvalidArgumentError("a $tag$ quote is not closed");
      if (end != std::string_view::npos) {
        out.sqlite.append(text.substr(i, end - i));
        out.postgres.append(text.substr(i, end - i));
        previous_word.clear();
        i = end;
        continue;
      }
      return absl::InvalidArgumentError(
          "a positional placeholder ('$') is not allowed; name the value (:name) and bind it "
          "in 'params'");
    }
    if (c == '?') {
      return absl::InvalidArgumentError(
          "a positional placeholder ('?') is not allowed; name the value (:name) and bind it "
          "in 'params'");
    }
    if (c == ':' && i + 1 < text.size() && text[i + 1] == ':') {  // a cast
      out.sqlite += "::";
      out.postgres += "::";
      i += 2;
      continue;
    }
    if (c == ':' && i + 1 < text.size() && IdentStart(text[i + 1])) {
      size_t end = i + 1;
      while (end < text.size() && IdentChar(text[end])) ++end;
      const std::string number = std::to_string(number_of(std::string(text.substr(i + 1, end - i - 1))));
      out.sqlite += "?" + number;
      out.postgres += "$" + number;
      if (first_word.empty()) first_word = "?";
      previous_word.clear();
      i = end;
      continue;
    }
    if (IdentStart(c)) {
      size_t end = i;
      while (end < text.size() && (IdentChar(text[end]) || text[end] == '$')) ++end;
      const std::string_view word = text.substr(i, end - i);
      out.sqlite.append(word);
      out.postgres.append(word);
      std::string lower = Lower(word);
      if (first_word.empty()) first_word = lower;
      // schema.table: the table is the last part.
      if (end < text.size() && text[end] == '.') {
        i = end;
        continue;
      }
      const bool table_keyword = previous_word == "from" || previous_word == "into" ||
                                 previous_word == "update" || previous_word == "join" ||
                                 previous_word == "table";
      // FROM ONLY t, JOIN LATERAL (...): the table (if any) comes next.
      if (table_keyword && (lower == "only" || lower == "lateral")) {
        i = end;
        continue;
      }
      if (lower != "set") note_table(lower);  // ON CONFLICT DO UPDATE SET
      previous_word = std::move(lower);
      i = end;
      continue;
    }
    if (c == '.') {  // keeps the keyword before a qualified name in view
      out.sqlite += c;
      out.postgres += c;
      ++i;
      continue;
    }
    out.sqlite += c;
    out.postgres += c;
    if (first_word.empty()) first_word = std::string(1, c);
    previous_word.clear();
    ++i;
  }
  static constexpr std::string_view kKinds[] = {"insert", "update", "delete", "select", "with"};
  if (first_word.empty()) return absl::InvalidArgumentError("the statement is empty");
  if (std::find(std::begin(kKinds), std::end(kKinds), first_word) == std::end(kKinds)) {
    return absl::InvalidArgumentError(
        "a sql step runs one INSERT, UPDATE, DELETE, SELECT or WITH statement, not '" +
        first_word +
        "' (schema changes, transaction control and settings would act on the transaction the "
        "step's checkpoint commits in)");
  }
  return out;
}

}  // namespace waystone
