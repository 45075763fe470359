// model::JsonPrefix (model/json_prefix.h) against nlohmann::json's parser: every prefix of a valid object text is
// accepted and complete() holds exactly at its end; a text the recognizer reads whole and calls complete is one the
// parser accepts as an object; random byte mutations never make the two disagree.
#include "model/json_prefix.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "fuzz/json_text.h"
#include "support/json_schema_check.h"
#include "support/test_support.h"

namespace cm = cider::model;
using cider::fuzz::small_exponents;
using nlohmann::json;

namespace {

// A random JSON value (objects and arrays up to `depth` deep), with escapes, unicode, numbers of every shape.
json random_value(std::mt19937_64& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 0 ? 7 : 5);
  switch (kind(rng)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng() % 2000001) - 1000000;
    case 3: {
      std::uniform_real_distribution<double> d(-1e6, 1e6);
      const double v = d(rng);
      return rng() % 3 == 0 ? v * 1e-30 : v;  // exponents too
    }
    case 4:
    case 5: {
      static const char* pieces[] = {"a", "key", " ", "\"", "\\", "/", "\n", "\t", "\x01", "é", "€", "😀", "{", "]", ","};
      std::string s;
      const int n = static_cast<int>(rng() % 6);
      for (int i = 0; i < n; ++i) s += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
      return s;
    }
    case 6: {
      json a = json::array();
      const int n = static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) a.push_back(random_value(rng, depth - 1));
      return a;
    }
    default: {
      json o = json::object();
      const int n = static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) {
        std::string key = "k";
        key += static_cast<char>('0' + rng() % 10);
        o[key] = random_value(rng, depth - 1);
      }
      return o;
    }
  }
}

json random_object(std::mt19937_64& rng) {
  json o = json::object();
  const int n = static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) o[std::string(1, static_cast<char>('a' + rng() % 26))] = random_value(rng, 4);
  return o;
}

// Whether the recognizer reads all of s and calls it complete.
bool complete_object(const std::string& s) {
  cm::JsonPrefix p;
  return p.feed(s) && p.complete();
}

// Whether the parser takes s as one object whose whitespace runs stay within the recognizer's bound.
bool parser_object(const std::string& s) {
  // The recognizer takes nothing after the object, not even whitespace (the reply ends there).
  if (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) return false;
  const std::string t = small_exponents(s);
  if (!json::accept(t)) return false;
  if (!json::parse(t).is_object()) return false;
  int run = 0;
  bool in_string = false, escape = false;
  for (char c : s) {  // whitespace outside strings, in a row
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    const bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    run = ws ? run + 1 : 0;
    if (run > cm::JsonPrefix::kMaxWhitespace) return false;
  }
  return true;
}

TEST(JsonPrefix, EveryPrefixOfAnObjectIsAcceptedAndOnlyTheWholeIsComplete) {
  auto rng = cider::test::make_rng(71);
  for (int t = 0; t < 400; ++t) {
    const json o = random_object(rng);
    for (int indent : {-1, 2}) {
      std::string s = o.dump(indent, ' ', false);  // raw UTF-8 and escapes
      if (t % 3 == 0) s.insert(0, " \n");
      cm::JsonPrefix p;
      for (size_t i = 0; i < s.size(); ++i) {
        ASSERT_TRUE(p.feed(static_cast<uint8_t>(s[i]))) << "byte " << i << " of " << s;
        ASSERT_EQ(p.complete(), i + 1 == s.size()) << "byte " << i << " of " << s;
      }
      cm::JsonPrefix after = p;
      EXPECT_FALSE(after.feed(' ')) << "nothing may follow the object: " << s;
      EXPECT_TRUE(parser_object(s));
    }
  }
}

// Mutations of valid texts (a byte replaced, inserted or deleted, from a JSON-heavy alphabet) and the recognizer's
// verdict on the whole text against the parser's, both ways.
TEST(JsonPrefix, AgreesWithTheParserOnMutatedTexts) {
  auto rng = cider::test::make_rng(72);
  const std::string alphabet = "{}[]\":,.-+eE0123456789 \n\\/utrfaln\x01\xC3\xA9xbz";
  int accepted = 0, refused = 0;
  for (int t = 0; t < 20000; ++t) {
    std::string s = random_object(rng).dump(t % 2 == 0 ? -1 : 1);
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: s[at] = c; break;
        case 1: s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), c); break;
        default: s.erase(at, 1); break;
      }
    }
    const bool ours = complete_object(s), theirs = parser_object(s);
    ASSERT_EQ(ours, theirs) << "text: " << s;
    (ours ? accepted : refused) += 1;
  }
  EXPECT_GT(accepted, 1000);  // both outcomes are exercised
  EXPECT_GT(refused, 1000);
}

TEST(JsonPrefix, RefusesWhatNoObjectTextStartsWith) {
  for (const char* bad : {"[", "\"a\"", "1", "{,", "{\"a\" 1", "{\"a\":}", "{\"a\":1,}", "{\"a\":01", "{\"a\":1.}",
                          "{\"a\":-}", "{\"a\":tru1", "{\"a\":\"\\x\"", "{\"a\":\"\x01", "{\"a\":[1,]", "{}}",
                          "{\"a\":\"\\u12G"}) {
    cm::JsonPrefix p;
    EXPECT_FALSE(p.feed(bad)) << bad;
  }
  for (const char* ok : {"{", " {\"", "{\"a\":-0.5e+", "{\"a\":[tr", "{\"a\":{\"b\":[[], {}, \"\\u00e9\", nu"}) {
    cm::JsonPrefix p;
    EXPECT_TRUE(p.feed(ok)) << ok;
    EXPECT_FALSE(p.complete()) << ok;
  }
}

TEST(JsonPrefix, BoundsDepthAndWhitespace) {
  cm::JsonPrefix deep;
  EXPECT_TRUE(deep.feed("{\"a\":"));
  for (int i = 1; i < cm::JsonPrefix::kMaxDepth; ++i) ASSERT_TRUE(deep.feed('[')) << i;
  EXPECT_FALSE(deep.feed('['));
  cm::JsonPrefix ws;
  EXPECT_TRUE(ws.feed("{"));
  for (int i = 0; i < cm::JsonPrefix::kMaxWhitespace; ++i) ASSERT_TRUE(ws.feed(i % 2 ? ' ' : '\n')) << i;
  EXPECT_FALSE(ws.feed(' '));
  cm::JsonPrefix in_string;  // whitespace inside strings is content, not bounded
  EXPECT_TRUE(in_string.feed("{\"" + std::string(200, ' ')));
}

}  // namespace

// ---- schemas ---------------------------------------------------------------------------------------------------------

namespace {

// A test-side validator of the supported keywords, independent of the recognizer (support/json_schema_check.h).
bool valid(const json& v, const json& s) { return cider::test::json_schema_valid(v, s); }

// A random schema of the supported keywords, objects and arrays up to `depth` deep.
json random_schema(std::mt19937_64& rng, int depth, bool object = false) {
  const int kind = object ? 0 : static_cast<int>(rng() % (depth > 0 ? 9 : 7));
  switch (kind) {
    case 0: {
      json s = {{"type", "object"}, {"properties", json::object()}};
      const int n = 1 + static_cast<int>(rng() % 4);
      json req = json::array();
      static const char* names[] = {"id", "name", "names", "n", "value", "tags", "é", "a b"};
      for (int i = 0; i < n; ++i) {
        const std::string k = names[rng() % 8];
        if (s["properties"].contains(k)) continue;
        s["properties"][k] = random_schema(rng, depth - 1);
        if (rng() % 2 == 0) req.push_back(k);
      }
      if (!req.empty()) s["required"] = req;
      if (rng() % 2 == 0) s["additionalProperties"] = false;
      if (rng() % 3 == 0) s["description"] = "annotations are ignored";
      return s;
    }
    case 1: return {{"type", "string"}};
    case 2: return {{"type", "integer"}};
    case 3: return {{"type", "number"}};
    case 4: return {{"type", "boolean"}};
    case 5: return {{"enum", json::array({"red", "green", "gr", 1, 12, nullptr, true})}};
    case 6: return {{"type", json::array({"string", "null"})}};
    case 7: return {{"type", "array"}, {"items", random_schema(rng, depth - 1)}};
    default: return {{"const", json{{"k", json::array({1, "x"})}}}};
  }
}

// A random walk through the recognizer: bytes it accepts, drawn with a pull toward closing, until complete(); it
// never meets a dead end (a prefix no byte continues).
std::string random_walk(const cm::JsonSchema& schema, std::mt19937_64& rng, bool* done) {
  cm::JsonPrefix p(&schema);
  std::string out;
  for (int step = 0; step < 600 && !p.complete(); ++step) {
    std::vector<uint8_t> ok, closing;
    for (int b = 0x20; b < 0x100; ++b) {  // UTF-8 too: a key may start with é
      cm::JsonPrefix q = p;
      if (q.feed(static_cast<uint8_t>(b))) {
        ok.push_back(static_cast<uint8_t>(b));
        if (b == '}' || b == ']' || b == '"' || b == ',' || b == ':' || (b >= '0' && b <= '9') || b == 'n' || b == 'u' ||
            b == 'l' || b == 't' || b == 'r' || b == 'e' || b == 'f' || b == 'a' || b == 's')
          closing.push_back(static_cast<uint8_t>(b));
      }
    }
    if (ok.empty()) {  // every accepted prefix must have an accepted continuation (else a draw has no token)
      ADD_FAILURE() << "dead end after " << out;
      break;
    }
    const bool pull = !closing.empty() && (out.size() > 30 || rng() % 3 == 0);
    const std::vector<uint8_t>& from = pull ? closing : ok;
    const uint8_t c = from[rng() % from.size()];
    EXPECT_TRUE(p.feed(c));
    out += static_cast<char>(c);
  }
  *done = p.complete();
  return out;
}

TEST(JsonSchemaPrefix, EveryCompletedWalkIsValidAgainstTheSchema) {
  auto rng = cider::test::make_rng(73);
  int completed = 0;
  for (int t = 0; t < 300; ++t) {
    const json schema = random_schema(rng, 3, /*object=*/true);
    const auto compiled = cm::JsonSchema::compile(schema);
    for (int w = 0; w < 6; ++w) {
      bool done = false;
      const std::string text = random_walk(*compiled, rng, &done);
      if (!done) continue;
      ++completed;
      const std::string parsed = small_exponents(text);
      ASSERT_TRUE(json::accept(parsed)) << text << "\nschema " << schema.dump();
      ASSERT_TRUE(valid(json::parse(parsed), schema)) << text << "\nschema " << schema.dump();
    }
  }
  EXPECT_GT(completed, 600);
}

// Documents in the recognizer's form (declared keys, required ones present) for random schemas: every prefix is
// accepted, complete() exactly at the end.
json random_instance(const json& s, std::mt19937_64& rng) {
  if (s.contains("const")) return s.at("const");
  if (s.contains("enum")) return s.at("enum")[rng() % s.at("enum").size()];
  const json t = s.at("type");
  const std::string type = t.is_array() ? t[rng() % t.size()].get<std::string>() : t.get<std::string>();
  if (type == "object") {
    json o = json::object();
    const json req = s.value("required", json::array());
    for (const auto& [k, sub] : s.at("properties").items()) {
      bool required = false;
      for (const auto& r : req) required = required || r == k;
      if (required || rng() % 2 == 0) o[k] = random_instance(sub, rng);
    }
    return o;
  }
  if (type == "array") {
    json a = json::array();
    for (int i = static_cast<int>(rng() % 3); i > 0; --i) a.push_back(random_instance(s.at("items"), rng));
    return a;
  }
  if (type == "string") return std::string(rng() % 2 ? "x\"y\\\n" : "plain");
  if (type == "integer") return static_cast<int64_t>(rng() % 2001) - 1000;
  if (type == "number") return -12.5e-3;
  if (type == "boolean") return rng() % 2 == 0;
  return nullptr;
}

TEST(JsonSchemaPrefix, EveryPrefixOfAValidDocumentIsAccepted) {
  auto rng = cider::test::make_rng(74);
  for (int t = 0; t < 300; ++t) {
    const json schema = random_schema(rng, 3, /*object=*/true);
    const auto compiled = cm::JsonSchema::compile(schema);
    const json doc = random_instance(schema, rng);
    ASSERT_TRUE(valid(doc, schema)) << doc.dump();
    const std::string text = doc.dump();  // compact: enum and const values are matched as dump() writes them
    cm::JsonPrefix p(compiled.get());
    for (size_t i = 0; i < text.size(); ++i) {
      ASSERT_TRUE(p.feed(static_cast<uint8_t>(text[i]))) << "byte " << i << " of " << text << "\nschema " << schema.dump();
      ASSERT_EQ(p.complete(), i + 1 == text.size()) << text;
    }
  }
}

// Whether the schema's recognizer takes the text (a prefix of an allowed document), and whether the text is whole.
bool schema_accepts(const cm::JsonSchema& schema, const std::string& text) {
  cm::JsonPrefix p(&schema);
  return p.feed(text);
}
bool schema_completes(const cm::JsonSchema& schema, const std::string& text) {
  cm::JsonPrefix p(&schema);
  return p.feed(text) && p.complete();
}

TEST(JsonSchemaPrefix, HoldsTheSchemasRules) {
  const auto s = cm::JsonSchema::compile(json::parse(R"({"type": "object", "properties": {
      "id": {"type": "integer"}, "tag": {"enum": ["a", "ab"]}, "ok": {"type": "boolean"}},
      "required": ["id"], "additionalProperties": false})"));
  const auto accepts = [&](const std::string& text) { return schema_accepts(*s, text); };
  const auto whole = [&](const std::string& text) { return schema_completes(*s, text); };
  EXPECT_TRUE(whole(R"({"id": 3})"));
  EXPECT_TRUE(whole(R"({"tag":"ab","id":-7,"ok":false})"));
  EXPECT_FALSE(accepts(R"({})"));                 // id is required
  EXPECT_FALSE(accepts(R"({"tag":"a"})"));        // … before the object closes
  EXPECT_FALSE(accepts(R"({"id": 1.5)"));         // an integer
  EXPECT_FALSE(accepts(R"({"idx")"));             // undeclared key
  EXPECT_FALSE(accepts(R"({"id":1,"id")"));       // a key twice
  EXPECT_FALSE(accepts(R"({"tag":"b")"));         // not in the enum
  EXPECT_FALSE(accepts(R"({"ok":1)"));            // a boolean
  EXPECT_FALSE(accepts(R"({"id":1,"ok":true,"tag":"a",)"));  // no key left for a comma
  EXPECT_TRUE(accepts(R"({"tag":"a)"));
}

// ---- tool calls (JsonSchema::tool_call) -------------------------------------------------------------------------

// Random tools: 1 to 4 names (some prefixes of others) with random object schemas; the call's keys as a format
// writes them.
struct RandomTools {
  std::vector<std::string> names;
  std::vector<json> params;
  std::string name_key, args_key;
  std::shared_ptr<const cm::JsonSchema> compiled;
};

RandomTools random_tools(std::mt19937_64& rng) {
  static const char* pool[] = {"get", "get_weather", "get_time", "f", "search", "a b", "é"};
  RandomTools t;
  const int n = 1 + static_cast<int>(rng() % 4);
  std::vector<std::shared_ptr<const cm::JsonSchema>> schemas;
  for (int i = 0; i < n; ++i) {
    const std::string name = pool[rng() % 7];
    if (std::find(t.names.begin(), t.names.end(), name) != t.names.end()) continue;
    t.names.push_back(name);
    t.params.push_back(random_schema(rng, 3, /*object=*/true));
    schemas.push_back(cm::JsonSchema::compile(t.params.back()));
  }
  t.name_key = "name";
  t.args_key = rng() % 2 == 0 ? "arguments" : "parameters";
  t.compiled = cm::JsonSchema::tool_call(t.names, schemas, t.name_key, t.args_key);
  return t;
}

// Whether v is one call of t: exactly the two keys, a name among the tools, arguments the named tool's schema allows.
bool valid_call(const json& v, const RandomTools& t) {
  if (!v.is_object() || v.size() != 2 || !v.contains(t.name_key) || !v.contains(t.args_key)) return false;
  const json& name = v.at(t.name_key);
  for (size_t i = 0; i < t.names.size(); ++i)
    if (name == t.names[i]) return valid(v.at(t.args_key), t.params[i]);
  return false;
}

TEST(JsonSchemaToolCall, EveryCompletedWalkIsOneCallWithArgumentsValidForItsName) {
  auto rng = cider::test::make_rng(75);
  int completed = 0;
  std::vector<int> picked(4, 0);  // the walks reach every tool of a set, not only the first
  for (int t = 0; t < 300; ++t) {
    const RandomTools tools = random_tools(rng);
    for (int w = 0; w < 6; ++w) {
      bool done = false;
      const std::string text = random_walk(*tools.compiled, rng, &done);
      if (!done) continue;
      ++completed;
      const std::string parsed = small_exponents(text);
      ASSERT_TRUE(json::accept(parsed)) << text;
      const json v = json::parse(parsed);
      ASSERT_TRUE(valid_call(v, tools)) << text << "\ntools " << json(tools.names).dump() << " "
                                        << json(tools.params).dump();
      for (size_t i = 0; i < tools.names.size(); ++i)
        if (v.at(tools.name_key) == tools.names[i]) ++picked[i];
    }
  }
  EXPECT_GT(completed, 600);
  EXPECT_GT(picked[1], 50);
}

TEST(JsonSchemaToolCall, EveryPrefixOfAValidCallIsAccepted) {
  auto rng = cider::test::make_rng(76);
  for (int t = 0; t < 300; ++t) {
    const RandomTools tools = random_tools(rng);
    const size_t i = rng() % tools.names.size();
    const json args = random_instance(tools.params[i], rng);
    // The name first, as the recognizer takes it (json's own dump would sort the keys).
    const std::string text = std::string(rng() % 2 ? " " : "") + "{\"" + tools.name_key + "\": " +
                             json(tools.names[i]).dump() + (rng() % 2 ? ",\n " : ",") + "\"" + tools.args_key +
                             "\":" + args.dump() + "}";
    ASSERT_TRUE(valid_call(json::parse(text), tools)) << text;
    cm::JsonPrefix p(tools.compiled.get());
    for (size_t k = 0; k < text.size(); ++k) {
      ASSERT_TRUE(p.feed(static_cast<uint8_t>(text[k]))) << "byte " << k << " of " << text << "\nparams "
                                                          << tools.params[i].dump();
      ASSERT_EQ(p.complete(), k + 1 == text.size()) << text;
    }
  }
}

TEST(JsonSchemaToolCall, HoldsTheCallsRules) {
  const auto weather = cm::JsonSchema::compile(json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]})"));
  const auto time = cm::JsonSchema::compile(json::parse(R"({"type": "object", "properties": {
      "tz": {"enum": ["CET", "UTC"]}}, "required": ["tz"], "additionalProperties": false})"));
  const auto s = cm::JsonSchema::tool_call({"get", "get_weather", "get_time"}, {time, weather, time}, "name", "arguments");
  const auto accepts = [&](const std::string& text) { return schema_accepts(*s, text); };
  const auto whole = [&](const std::string& text) { return schema_completes(*s, text); };
  EXPECT_TRUE(whole(R"({"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}})"));
  EXPECT_TRUE(whole(R"({"name":"get","arguments":{"tz":"UTC"}})"));
  EXPECT_TRUE(whole(R"({"name":"get_time","arguments":{"tz":"CET"}})"));
  EXPECT_FALSE(accepts(R"({"arguments")"));                               // the name first
  EXPECT_FALSE(accepts(R"({"name":"get_date")"));                         // not a tool
  EXPECT_FALSE(accepts(R"({"name":"get"})"));                             // arguments are required
  EXPECT_FALSE(accepts(R"({"name":"get","name")"));                       // no key twice
  EXPECT_FALSE(accepts(R"({"name":"get","extra")"));                      // no other key
  EXPECT_FALSE(accepts(R"({"name":"get","arguments":{"city")"));          // get's parameters, not get_weather's
  EXPECT_FALSE(accepts(R"({"name":"get_weather","arguments":{"tz")"));    // … and the other way round
  EXPECT_FALSE(accepts(R"({"name":"get_weather","arguments":{}})"));      // city is required
  EXPECT_FALSE(accepts(R"({"name":"get_weather","arguments":[)"));        // arguments are an object
  EXPECT_FALSE(accepts(R"({"name":"get","arguments":{"tz":"UTC"},)"));    // nothing after the arguments
  EXPECT_TRUE(accepts(R"({"name":"get_weather","arguments":{"city":"O)"));
  // A name given twice, no names, or counts that differ are refused.
  EXPECT_THROW((void)cm::JsonSchema::tool_call({"a", "a"}, {time, time}, "name", "arguments"), cider::Error);
  EXPECT_THROW((void)cm::JsonSchema::tool_call({}, {}, "name", "arguments"), cider::Error);
  EXPECT_THROW((void)cm::JsonSchema::tool_call({"a"}, {time, time}, "name", "arguments"), cider::Error);
}

TEST(JsonSchemaPrefix, RefusesWhatItCannotEnforceNamingIt) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}})", "pattern"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}})", "anyOf"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}})", "$ref"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "minLength": 2}}})", "minLength"},
      {R"({"type": "string"})", "root"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "required"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "items": [{}]}}})", "items"},
      {R"({"type": "object", "additionalProperties": {"type": "string"}})", "additionalProperties"},
      {R"({"type": "object", "properties": {"a": {"type": "strnig"}}})", "strnig"},
  };
  for (const auto& [schema, word] : bad) {
    try {
      (void)cm::JsonSchema::compile(json::parse(schema));
      ADD_FAILURE() << "accepted " << schema;
    } catch (const cider::Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  }
  std::string deep = R"({"type": "object", "properties": {"a": )";
  for (int i = 0; i < 40; ++i) deep += R"({"type": "array", "items": )";
  deep += "{}" + std::string(40, '}') + "}}";
  EXPECT_THROW((void)cm::JsonSchema::compile(json::parse(deep)), cider::Error);
}

}  // namespace
