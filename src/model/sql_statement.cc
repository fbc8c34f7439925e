#include "model/sql_statement.h"

#include <algorithm>
#include <cctype>

#include "model/sql_tenant_scope.h"

namespace waystone {
namespace {

bool IdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_'; }
bool IdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

absl::Status Refused(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

// Functions a statement may not call: they act beyond the statement (the session's
// settings, other sessions, files, the server) or stall the transaction it shares.
constexpr std::string_view kRefusedFunctions[] = {
    "set_config", "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "pg_sleep",
    "pg_sleep_for", "pg_sleep_until", "pg_read_file", "pg_read_binary_file", "pg_ls_dir",
    "pg_stat_file", "lo_import", "lo_export", "dblink", "dblink_exec", "pg_advisory_lock",
    "pg_advisory_xact_lock", "load_extension", "writefile", "readfile", "edit", "fts3_tokenizer",
    // They run SQL given as a string, where no check of the statement's text sees it.
    "query_to_xml", "query_to_xml_and_xmlschema", "query_to_xmlschema", "table_to_xml",
    "table_to_xml_and_xmlschema", "table_to_xmlschema", "cursor_to_xml", "schema_to_xml",
    "schema_to_xml_and_xmlschema", "database_to_xml", "database_to_xml_and_xmlschema"};

}  // namespace

absl::StatusOr<SqlStatement> ParseSqlStatement(std::string_view text) {
  SqlStatement out;
  out.text = std::string(text);
  if (text.find("{{") != std::string_view::npos) {
    return Refused(
        "the statement contains a template ('{{'); values go in as :named parameters bound "
        "from 'params', never spliced into the SQL text");
  }
  std::string first_word;
  std::string previous_word;  // the last word, lower case ("" after any other token)
  bool ended = false;         // a ';' was seen: only blanks and comments may follow
  auto number_of = [&](const std::string& name) {
    auto it = std::find(out.names.begin(), out.names.end(), name);
    if (it == out.names.end()) {
      out.names.push_back(name);
      return out.names.size();
    }
    return static_cast<size_t>(it - out.names.begin()) + 1;
  };
  auto note_identifier = [&](std::string name) {
    if (std::find(out.identifiers.begin(), out.identifiers.end(), name) == out.identifiers.end()) {
      out.identifiers.push_back(std::move(name));
    }
  };
  auto token = [&](SqlToken::Kind kind, std::string text) {
    out.tokens.push_back({kind, std::move(text)});
  };
  auto copy = [&](std::string_view piece) {
    out.sqlite.append(piece);
    out.postgres.append(piece);
  };
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c)) != 0) {
      copy(text.substr(i, 1));
      ++i;
      continue;
    }
    if (c == '-' && i + 1 < text.size() && text[i + 1] == '-') {
      // A line comment ends at a line feed or a carriage return (PostgreSQL ends it
      // at either): the same boundary the databases see.
      size_t end = text.find_first_of("\r\n", i);
      if (end == std::string_view::npos) end = text.size();
      copy(text.substr(i, end - i));
      i = end;
      continue;
    }
    if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      const size_t close = text.find("*/", i + 2);
      if (close == std::string_view::npos) return Refused("a '/*' comment is not closed");
      if (text.substr(i + 2, close - i - 2).find("/*") != std::string_view::npos) {
        return Refused(
            "a comment inside a comment is not allowed (PostgreSQL nests them, "
            "SQLite does not)");
      }
      copy(text.substr(i, close + 2 - i));
      i = close + 2;
      continue;
    }
    if (ended) {
      return Refused("the statement goes on after its ';': a sql step runs exactly one statement");
    }
    if (c == ';') {
      ended = true;
      ++i;
      continue;
    }
    if (c == '\'' || c == '"' || c == '`' || c == '[') {
      const char close = c == '[' ? ']' : c;
      size_t end = i + 1;
      while (true) {
        end = text.find(close, end);
        if (end == std::string_view::npos) {
          return Refused(std::string("a ") + c + " quote is not closed");
        }
        if (close != ']' && end + 1 < text.size() && text[end + 1] == close) {
          end += 2;  // a doubled quote stays inside
          continue;
        }
        break;
      }
      const std::string_view quoted = text.substr(i, end + 1 - i);
      copy(quoted);
      if (c != '\'') note_identifier(Lower(quoted.substr(1, quoted.size() - 2)));
      if (c == '\'') {
        token(SqlToken::Kind::kString, std::string(quoted));
      } else {
        token(SqlToken::Kind::kQuoted, Lower(quoted.substr(1, quoted.size() - 2)));
      }
      if (first_word.empty()) first_word.push_back('?');  // not a word: refused below
      previous_word.clear();
      i = end + 1;
      continue;
    }
    if (c == '$') {
      return Refused(
          "'$' is not allowed: no positional placeholders ($1; name the value :name and bind "
          "it in 'params') and no dollar quoting (SQLite reads $name as a parameter)");
    }
    if (c == '?') {
      return Refused(
          "a positional placeholder ('?') is not allowed; name the value (:name) and bind it "
          "in 'params'");
    }
    if (c == '\\') {
      return Refused("a backslash outside a string is not allowed");
    }
    if (c == ':' && i + 1 < text.size() && text[i + 1] == ':') {  // a cast
      copy("::");
      token(SqlToken::Kind::kSymbol, "::");
      previous_word.clear();
      i += 2;
      continue;
    }
    if (c == ':' && i + 1 < text.size() && IdentStart(text[i + 1])) {
      size_t end = i + 1;
      while (end < text.size() && IdentChar(text[end])) ++end;
      const std::string name(text.substr(i + 1, end - i - 1));
      const std::string number = std::to_string(number_of(name));
      token(SqlToken::Kind::kParam, name);
      out.sqlite += "?" + number;
      out.postgres += "$" + number;
      if (first_word.empty()) first_word.push_back('?');  // not a word: refused below
      previous_word.clear();
      i = end;
      continue;
    }
    if (IdentStart(c)) {
      size_t end = i;
      while (end < text.size() && IdentChar(text[end])) ++end;
      const std::string_view word = text.substr(i, end - i);
      std::string lower = Lower(word);
      if (end < text.size() && (text[end] == '\'' || text[end] == '"' || text[end] == '&')) {
        // E'..' (backslash escapes), U&'..' / U&"..." (escaped code points): the same
        // text would read differently to SQLite and to this check. B'', X'', N'' are plain.
        if (lower == "e" || lower == "u") {
          return Refused(
              "escape strings (E'...', U&'...') are not allowed; write a standard "
              "string or bind the value as a parameter");
        }
      }
      if (end < text.size() && text[end] == '$') {
        return Refused("'$' in a name is not allowed (SQLite reads $name as a parameter)");
      }
      copy(word);
      if (first_word.empty()) first_word = lower;
      if (previous_word == "or" && lower == "rollback") {
        return Refused(
            "OR ROLLBACK is not allowed: it would roll back the transaction the "
            "step's checkpoint commits in");
      }
      if (std::find(std::begin(kRefusedFunctions), std::end(kRefusedFunctions), lower) !=
          std::end(kRefusedFunctions)) {
        return Refused("'" + lower +
                       "' is not allowed in a sql step: it acts beyond the "
                       "statement (settings, other sessions, files, locks or time)");
      }
      note_identifier(lower);
      token(SqlToken::Kind::kWord, lower);
      previous_word = std::move(lower);
      i = end;
      continue;
    }
    copy(text.substr(i, 1));
    token(SqlToken::Kind::kSymbol, std::string(1, c));
    if (first_word.empty()) first_word = std::string(1, c);
    previous_word.clear();
    ++i;
  }
  static constexpr std::string_view kKinds[] = {"insert", "update", "delete", "select", "with"};
  if (first_word.empty()) return Refused("the statement is empty");
  if (std::find(std::begin(kKinds), std::end(kKinds), first_word) == std::end(kKinds)) {
    return Refused(
        "a sql step runs one INSERT, UPDATE, DELETE, SELECT or WITH statement, not '" + first_word +
        "' (schema changes, transaction control and settings would act on the transaction the "
        "step's checkpoint commits in)");
  }
  out.unscoped = TenantScopeProblem(out.tokens);
  return out;
}

}  // namespace waystone
