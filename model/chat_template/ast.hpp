// The syntax tree of a parsed chat template: expressions and statements as jinja2 defines them,
// limited to the subset chat templates use.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/chat_template/value.hpp"

namespace fp8serve::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct KeywordArg {
  std::string name;
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    literal,    // value
    name,       // name
    list,       // items
    dict,       // items (pairs of key, value)
    get_attr,   // object, name
    get_item,   // object, index
    slice,      // object, slice_parts[3] (nullptr when omitted)
    call,       // object, args, kwargs
    filter,     // object (nullptr for a filter block's body), name, args, kwargs
    test,       // object, name, args, negated
    unary,      // op ("-", "+", "not"), object
    binary,     // op, left, right; also "and", "or", "~", "in", "not in"
    compare,    // left, chained (op, operand) pairs
    conditional // condition, then, otherwise (nullptr -> undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter/test name or operator
  ExprPtr object;
  ExprPtr left, right;
  ExprPtr condition, then, otherwise;
  std::vector<ExprPtr> items;  // list items, or dict keys/values interleaved
  ExprPtr slice_parts[3];
  std::vector<ExprPtr> args;
  std::vector<KeywordArg> kwargs;
  std::vector<std::pair<std::string, ExprPtr>> chain;  // compare
  bool negated = false;
  bool is_tuple = false;  // list literal written as a tuple: (a, b)

  Expr(Kind k, int l) : kind(k), line(l) {}
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // nullptr: required
};

struct Stmt {
  enum class Kind {
    text,        // text
    output,      // expr
    if_,         // branches (condition, body), else_body
    for_,        // targets, expr (iterable), condition (loop filter), body, else_body
    set,         // targets (one or more names) or ns_target/attr, expr
    set_block,   // targets[0], body, filter (optional filter expr applied to the body)
    macro,       // name, params, body
    call_block,  // expr (the call), params (caller's), body
    filter_block,// filter (chain with a null innermost object), body
    break_,
    continue_,
    scope        // body rendered as is ({% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  ExprPtr filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string ns_target;  // {% set ns.attr = ... %}: ns_target = "ns", targets = {"attr"}
  std::string name;
  std::vector<MacroParam> params;

  Stmt(Kind k, int l) : kind(k), line(l) {}
};

}  // namespace fp8serve::jinja
