#include "model/sql_tenant_scope.h"

#include <initializer_list>
#include <span>
#include <string_view>

namespace waystone {
namespace {

using Kind = SqlToken::Kind;

// Words that end a WHERE clause at the top level (what may follow it).
constexpr std::string_view kAfterWhere[] = {"returning", "group",  "having", "window", "order",
                                            "limit",     "offset", "fetch",  "for"};

// Reads one statement's tokens; each method returns "" or the problem.
class ScopeCheck {
 public:
  explicit ScopeCheck(const std::vector<SqlToken>& tokens) : t_(tokens) {}

  std::string Problem() {
    if (t_.empty() || t_[0].kind != Kind::kWord) return "it is not one statement";
    const std::string& kind = t_[0].text;
    if (kind == "with") {
      return "WITH is not checked for tenants; write one INSERT, UPDATE, DELETE or SELECT on "
             "one table";
    }
    for (size_t i = 0; i < t_.size(); ++i) {
      if (t_[i].kind != Kind::kWord) continue;
      const std::string& word = t_[i].text;
      if (word == "select" && i > 0) {
        return "a subquery (or INSERT ... SELECT) reads rows the tenant check cannot see";
      }
      if (word == "join") return "it joins a second table, whose rows the tenant check cannot see";
      if (word == "union" || word == "intersect" || word == "except") {
        return "it combines statements (" + word + ")";
      }
      if (word == "or" && Word(i + 1, "replace")) {
        return "OR REPLACE deletes the row it conflicts with, which may be another tenant's";
      }
    }
    if (kind == "select" && FindTop(1, {"from"}) == t_.size()) return "";  // no table
    bool binds = false;
    for (const SqlToken& token : t_) binds = binds || IsTenantParam(token);
    if (!binds) {
      return "it does not use :tenant (give each business table a `tenant` column; Waystone "
             "binds :tenant to the instance's tenant)";
    }
    if (kind == "insert") return Insert();
    if (kind == "update") return Update();
    if (kind == "delete") return Delete();
    if (kind == "select") return Select();
    return "it is not an INSERT, UPDATE, DELETE or SELECT";
  }

 private:
  static bool IsTenantParam(const SqlToken& token) {
    return token.kind == Kind::kParam && token.text == kTenantParam;
  }
  bool Word(size_t i, std::string_view word) const {
    return i < t_.size() && t_[i].kind == Kind::kWord && t_[i].text == word;
  }
  bool Symbol(size_t i, std::string_view symbol) const {
    return i < t_.size() && t_[i].kind == Kind::kSymbol && t_[i].text == symbol;
  }
  bool Name(size_t i) const {
    return i < t_.size() && (t_[i].kind == Kind::kWord || t_[i].kind == Kind::kQuoted);
  }
  bool NamesTenant(size_t i) const { return Name(i) && t_[i].text == "tenant"; }

  // The first of `words` at or after `from` outside parentheses; t_.size() when none.
  size_t FindTop(size_t from, std::initializer_list<std::string_view> words) const {
    return FindTop(from, std::span<const std::string_view>(words.begin(), words.size()));
  }
  size_t FindTop(size_t from, std::span<const std::string_view> words) const {
    int depth = 0;
    for (size_t i = from; i < t_.size(); ++i) {
      if (Symbol(i, "(")) ++depth;
      if (Symbol(i, ")")) --depth;
      if (depth != 0 || t_[i].kind != Kind::kWord) continue;
      for (std::string_view word : words) {
        if (t_[i].text == word) return i;
      }
    }
    return t_.size();
  }

  // `[schema.]table` at i: notes its name as a qualifier; the index after it, or 0.
  size_t Table(size_t i) {
    if (!Name(i)) return 0;
    std::string name = t_[i].text;
    ++i;
    if (Symbol(i, ".") && Name(i + 1)) {
      name = t_[i + 1].text;
      i += 2;
    }
    qualifiers_.push_back(name);
    return i;
  }

  // An alias at i (`AS x`, or `x` unless x is one of `next`): noted; the index after it.
  size_t Alias(size_t i, std::initializer_list<std::string_view> next) {
    if (Word(i, "as") && Name(i + 1)) {
      qualifiers_.push_back(t_[i + 1].text);
      return i + 2;
    }
    if (!Name(i)) return i;
    for (std::string_view word : next) {
      if (Word(i, word)) return i;
    }
    qualifiers_.push_back(t_[i].text);
    return i + 1;
  }

  // `tenant` or `<table or alias>.tenant` at i: how many tokens; 0 when not.
  size_t TenantColumn(size_t i) const {
    if (Word(i, "tenant")) return 1;
    if (!Name(i) || !Symbol(i + 1, ".") || !Word(i + 2, "tenant")) return 0;
    if (t_[i].text == "excluded") return 0;  // the row proposed for insertion, not the stored one
    for (const std::string& qualifier : qualifiers_) {
      if (qualifier == t_[i].text) return 3;
    }
    return 0;
  }

  // The WHERE clause from `begin` (after WHERE) to `end`: no OR outside parentheses, and
  // `tenant = :tenant` first, then AND or nothing.
  std::string Where(size_t begin, size_t end) const {
    int depth = 0;
    for (size_t i = begin; i < end; ++i) {
      if (Symbol(i, "(")) ++depth;
      if (Symbol(i, ")")) --depth;
      if (depth == 0 && Word(i, "or")) {
        return "its WHERE has an OR outside parentheses, which could match another tenant's "
               "rows: write tenant = :tenant AND (a OR b)";
      }
    }
    size_t next = 0;
    if (size_t column = TenantColumn(begin); column > 0 && Symbol(begin + column, "=") &&
                                             begin + column + 1 < end &&
                                             IsTenantParam(t_[begin + column + 1])) {
      next = begin + column + 2;
    } else if (begin + 2 < end && IsTenantParam(t_[begin]) && Symbol(begin + 1, "=") &&
               TenantColumn(begin + 2) > 0) {
      next = begin + 2 + TenantColumn(begin + 2);
    } else {
      return "its WHERE must begin with tenant = :tenant (then AND the rest)";
    }
    if (next < end && !Word(next, "and")) {
      return "tenant = :tenant must be followed by AND or end the WHERE (found '" + t_[next].text +
             "')";
    }
    return "";
  }

  // The elements of the parenthesised list at i, split at its top-level commas; the
  // index after its ')' in `after`, or 0 when the list does not close.
  std::vector<std::pair<size_t, size_t>> List(size_t i, size_t* after) const {
    std::vector<std::pair<size_t, size_t>> elements;
    *after = 0;
    if (!Symbol(i, "(")) return elements;
    int depth = 0;
    size_t start = i + 1;
    for (size_t j = i; j < t_.size(); ++j) {
      if (Symbol(j, "(")) ++depth;
      if (Symbol(j, ")") && --depth == 0) {
        elements.emplace_back(start, j);
        *after = j + 1;
        return elements;
      }
      if (depth == 1 && Symbol(j, ",")) {
        elements.emplace_back(start, j);
        start = j + 1;
      }
    }
    return {};
  }

  // INSERT [OR IGNORE|ABORT|FAIL] INTO t [AS a] (cols) VALUES (...), ... [ON CONFLICT ...]
  // [RETURNING ...]
  std::string Insert() {
    size_t i = 1;
    if (Word(i, "or")) i += 2;  // OR REPLACE and OR ROLLBACK are refused before
    if (!Word(i, "into")) return "expected INSERT INTO";
    i = Table(i + 1);
    if (i == 0) return "expected a table after INSERT INTO";
    if (Word(i, "as") && Name(i + 1)) {
      qualifiers_.push_back(t_[i + 1].text);
      i += 2;
    }
    size_t after = 0;
    const auto columns = List(i, &after);
    int tenant_column = -1;
    for (size_t c = 0; c < columns.size(); ++c) {
      if (columns[c].second == columns[c].first + 1 && NamesTenant(columns[c].first)) {
        tenant_column = static_cast<int>(c);
      }
    }
    if (tenant_column < 0) {
      return "its column list must name tenant, with :tenant as its value: INSERT INTO t "
             "(tenant, ...) VALUES (:tenant, ...)";
    }
    i = after;
    if (!Word(i, "values")) return "an INSERT takes VALUES (...) (no SELECT, no DEFAULT VALUES)";
    ++i;
    while (true) {
      const auto values = List(i, &after);
      if (after == 0) return "expected a parenthesised row of VALUES";
      const auto& value = values.size() > static_cast<size_t>(tenant_column)
                              ? values[tenant_column]
                              : std::pair<size_t, size_t>{0, 0};
      if (value.second != value.first + 1 || !IsTenantParam(t_[value.first])) {
        return "the value of the tenant column must be :tenant, in every row";
      }
      i = after;
      if (!Symbol(i, ",")) break;
      ++i;
    }
    if (Word(i, "on")) {
      if (!Word(i + 1, "conflict")) return "expected ON CONFLICT";
      const size_t action = FindTop(i + 2, {"do"});
      if (Word(action + 1, "nothing")) {
        i = action + 2;
      } else if (Word(action + 1, "update") && Word(action + 2, "set")) {
        const size_t where = FindTop(action + 3, {"where", "returning"});
        if (!Word(where, "where")) {
          return "ON CONFLICT ... DO UPDATE needs WHERE tenant = :tenant: the row it conflicts "
                 "with may be another tenant's";
        }
        for (size_t j = action + 3; j < where; ++j) {
          if (NamesTenant(j))
            return "its SET names tenant: no statement moves a row to another tenant";
        }
        const size_t end = FindTop(where + 1, {"returning"});
        if (std::string problem = Where(where + 1, end); !problem.empty()) return problem;
        i = end;
      } else {
        return "expected ON CONFLICT ... DO NOTHING or DO UPDATE SET ... WHERE tenant = :tenant";
      }
    }
    if (Word(i, "returning")) i = t_.size();
    if (i < t_.size()) return "unexpected '" + t_[i].text + "' after the VALUES";
    return "";
  }

  // UPDATE [OR ...] [ONLY] t [[AS] a] SET ... WHERE tenant = :tenant ...
  std::string Update() {
    size_t i = 1;
    if (Word(i, "or")) i += 2;
    if (Word(i, "only")) ++i;
    i = Table(i);
    if (i == 0) return "expected a table after UPDATE";
    i = Alias(i, {"set"});
    if (!Word(i, "set")) return "expected SET after UPDATE's table";
    const size_t where = FindTop(i + 1, {"where", "from", "returning", "order", "limit"});
    if (Word(where, "from")) return "UPDATE ... FROM reads a second table";
    if (!Word(where, "where")) return "an UPDATE needs WHERE tenant = :tenant";
    for (size_t j = i + 1; j < where; ++j) {
      if (NamesTenant(j)) return "its SET names tenant: no statement moves a row to another tenant";
    }
    return Where(where + 1, FindTop(where + 1, kAfterWhere));
  }

  // DELETE FROM [ONLY] t [[AS] a] WHERE tenant = :tenant ...
  std::string Delete() {
    if (!Word(1, "from")) return "expected DELETE FROM";
    size_t i = 2;
    if (Word(i, "only")) ++i;
    i = Table(i);
    if (i == 0) return "expected a table after DELETE FROM";
    i = Alias(i, {"where", "using", "returning"});
    if (Word(i, "using")) return "DELETE ... USING reads a second table";
    if (!Word(i, "where")) return "a DELETE needs WHERE tenant = :tenant";
    return Where(i + 1, FindTop(i + 1, kAfterWhere));
  }

  // SELECT ... FROM t [[AS] a] WHERE tenant = :tenant ...
  std::string Select() {
    size_t i = Table(FindTop(1, {"from"}) + 1);
    if (i == 0) return "expected a table after FROM";
    if (Symbol(i, "(")) return "it selects from a function, which the tenant check cannot see into";
    i = Alias(i, {"where", "group", "order", "limit", "natural", "left", "right", "inner", "cross",
                  "full"});
    if (Symbol(i, ",")) return "it reads a second table (a comma in FROM)";
    if (!Word(i, "where")) return "a SELECT from a table needs WHERE tenant = :tenant";
    return Where(i + 1, FindTop(i + 1, kAfterWhere));
  }

  const std::vector<SqlToken>& t_;
  std::vector<std::string> qualifiers_;  // the table's name and alias: what may qualify tenant
};

}  // namespace

std::string TenantScopeProblem(const std::vector<SqlToken>& tokens) {
  return ScopeCheck(tokens).Problem();
}

}  // namespace waystone
