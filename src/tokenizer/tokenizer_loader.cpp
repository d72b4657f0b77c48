// Tokenizer loading: tokenizer.json and tokenizer_config.json → validated Tokenizer tables.
// Every field the engine relies on is checked here, once (RELIABILITY.md, "Tokenizer and chat");
// errors are kCorrupt (malformed) or kUnsupported (well-formed but a feature this layer does not
// implement) and name the field, e.g. "model.merges[17]: 'xy' is not in model.vocab".
#include <algorithm>
#include <filesystem>
#include <unordered_set>

#include "io/json_file.h"
#include "io/text.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

using Json = nlohmann::json;

class TokenizerLoader {
 public:
  static Expected<std::unique_ptr<Tokenizer>> build(const Json& root, const Json* config);

 private:
  static Status load_model(const Json& model, Tokenizer& t, int32_t* n_model_vocab);
  static Status load_added_tokens(const Json* added, int32_t n_model_vocab, Tokenizer& t);
  static Status load_normalizer(const Json* normalizer);
  static Status load_pre_tokenizer(const Json* pre, Tokenizer& t);
  static Status load_pre_tokenizer_step(const Json& step, const std::string& field, Tokenizer& t, bool* has_byte_level);
  static Status load_decoder(const Json* decoder);
  static Status load_post_processor(const Json* post, const std::string& field, const Tokenizer& t,
                                    std::vector<int32_t>* prefix, std::vector<int32_t>* suffix);
  static Status load_config(const Json& config, Tokenizer& t, bool* has_add_flags);
};

namespace {

Status corrupt(const std::string& field, const std::string& what) {
  return Status(StatusCode::kCorrupt, field + ": " + what);
}
Status unsupported(const std::string& field, const std::string& what) {
  return Status(StatusCode::kUnsupported, field + ": " + what);
}

// The member `key` of object `obj`, or nullptr if it is absent or JSON null.
const Json* member(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Expected<bool> optional_bool(const Json& obj, const char* key, bool fallback, const std::string& field) {
  const Json* v = member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return corrupt(field + "." + key, "expected true or false");
  return v->get<bool>();
}

Expected<std::string> required_string(const Json& obj, const char* key, const std::string& field) {
  const Json* v = member(obj, key);
  if (v == nullptr || !v->is_string()) return corrupt(field + "." + key, "expected a string");
  return v->get<std::string>();
}

// A JSON integer as int64, or nullopt for anything else (floats, strings, out of range).
std::optional<int64_t> as_int(const Json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

}  // namespace

Status TokenizerLoader::load_model(const Json& model, Tokenizer& t, int32_t* n_model_vocab) {
  if (!model.is_object()) return corrupt("model", "expected an object");
  if (const Json* type = member(model, "type")) {
    if (!type->is_string()) return corrupt("model.type", "expected a string");
    if (type->get<std::string>() != "BPE")
      return unsupported("model.type", fmt::format("{} is not supported (only BPE)", quote_text(type->get<std::string>())));
  }
  if (const Json* dropout = member(model, "dropout")) {
    if (!dropout->is_number()) return corrupt("model.dropout", "expected a number or null");
    if (dropout->get<double>() != 0.0) return unsupported("model.dropout", "BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* v = member(model, key)) {
      if (!v->is_string()) return corrupt(std::string("model.") + key, "expected a string or null");
      if (!v->get<std::string>().empty()) return unsupported(std::string("model.") + key, "is not supported");
    }
  }
  DI_ASSIGN_OR_RETURN(const bool byte_fallback, optional_bool(model, "byte_fallback", false, "model"));
  if (byte_fallback) return unsupported("model.byte_fallback", "is not supported (byte-level BPE needs none)");
  DI_ASSIGN_OR_RETURN(const bool ignore_merges, optional_bool(model, "ignore_merges", false, "model"));

  const Json* vocab = member(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return corrupt("model.vocab", "expected an object of token → id");
  if (vocab->size() > static_cast<size_t>(INT32_MAX / 2)) return corrupt("model.vocab", "too many tokens");
  const auto n_vocab = static_cast<int32_t>(vocab->size());
  t.strings_.assign(n_vocab, std::string());
  t.ids_by_string_.reserve(vocab->size() + 1024);
  std::vector<bool> assigned(n_vocab, false);
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const std::string& token = it.key();
    const auto id = as_int(it.value());
    if (!id) return corrupt("model.vocab", fmt::format("the id of {} is not an integer", quote_text(token)));
    if (*id < 0 || *id >= n_vocab) {
      return corrupt("model.vocab", fmt::format("{} has id {}, outside [0, {}) (ids must be dense)", quote_text(token),
                                                *id, n_vocab));
    }
    if (token.empty()) return corrupt("model.vocab", fmt::format("id {} is the empty string", *id));
    if (assigned[*id]) {
      return corrupt("model.vocab", fmt::format("id {} is given to both {} and {}", *id, quote_text(t.strings_[*id]),
                                                quote_text(token)));
    }
    assigned[*id] = true;
    t.strings_[*id] = token;
    t.ids_by_string_.emplace(token, static_cast<int32_t>(*id));
  }
  *n_model_vocab = n_vocab;

  // The 256 single-byte tokens must all exist, or some inputs could not be encoded.
  std::array<int32_t, 256> byte_ids{};
  for (int b = 0; b < 256; ++b) {
    const std::string token = byte_level::encode(std::string(1, static_cast<char>(b)));
    auto it = t.ids_by_string_.find(token);
    if (it == t.ids_by_string_.end()) {
      return corrupt("model.vocab", fmt::format("no token for byte 0x{:02X} ({}): a byte-level vocabulary needs all 256",
                                                b, quote_text(token)));
    }
    byte_ids[b] = it->second;
  }

  const Json* merges = member(model, "merges");
  if (merges == nullptr || !merges->is_array()) return corrupt("model.merges", "expected an array");
  std::vector<BpeMerge> rules;
  rules.reserve(merges->size());
  std::string joined;
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    const std::string field = fmt::format("model.merges[{}]", i);
    std::string_view left, right;
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      if (line.starts_with("#version")) continue;  // HF skips the header line of merges.txt
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        return corrupt(field, fmt::format("{} is not two tokens separated by one space", quote_text(line)));
      left = std::string_view(line).substr(0, space);
      right = std::string_view(line).substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get_ref<const std::string&>();
      right = m[1].get_ref<const std::string&>();
    } else {
      return corrupt(field, "expected \"left right\" or [\"left\", \"right\"]");
    }
    BpeMerge rule;
    for (auto [part, slot] : {std::pair{left, &rule.left}, std::pair{right, &rule.right}}) {
      auto it = t.ids_by_string_.find(part);
      if (it == t.ids_by_string_.end()) return corrupt(field, fmt::format("{} is not in model.vocab", quote_text(part)));
      *slot = it->second;
    }
    joined.assign(left);
    joined.append(right);
    auto it = t.ids_by_string_.find(joined);
    if (it == t.ids_by_string_.end())
      return corrupt(field, fmt::format("the merged token {} is not in model.vocab", quote_text(joined)));
    rule.result = it->second;
    rules.push_back(rule);
  }

  std::unordered_map<std::string, int32_t> whole_tokens;
  if (ignore_merges) {
    for (int32_t id = 0; id < n_vocab; ++id) {
      if (auto bytes = byte_level::decode(t.strings_[id])) whole_tokens.emplace(std::move(*bytes), id);
    }
  }
  t.bpe_ = BpeModel(byte_ids, rules, ignore_merges, std::move(whole_tokens));
  return Status::ok();
}

Status TokenizerLoader::load_added_tokens(const Json* added, int32_t n_model_vocab, Tokenizer& t) {
  std::vector<AddedToken> tokens;
  if (added != nullptr) {
    if (!added->is_array()) return corrupt("added_tokens", "expected an array");
    // The vocabulary grows by the added tokens that are not model tokens; every id must fall
    // below the resulting size, so ids stay dense and tables stay proportional to the file.
    int64_t n_new = 0;
    for (const Json& a : *added) {
      if (a.is_object()) {
        const Json* c = member(a, "content");
        if (c != nullptr && c->is_string() && !t.ids_by_string_.contains(c->get<std::string>())) ++n_new;
      }
    }
    const int64_t n_total = n_model_vocab + n_new;
    if (n_total > INT32_MAX) return corrupt("added_tokens", "too many tokens");
    std::unordered_set<std::string> contents;
    std::unordered_set<int32_t> ids;
    for (size_t i = 0; i < added->size(); ++i) {
      const Json& a = (*added)[i];
      const std::string field = fmt::format("added_tokens[{}]", i);
      if (!a.is_object()) return corrupt(field, "expected an object");
      const Json* idv = member(a, "id");
      const auto id = idv ? as_int(*idv) : std::nullopt;
      if (!id) return corrupt(field + ".id", "expected an integer");
      DI_ASSIGN_OR_RETURN(std::string content, required_string(a, "content", field));
      if (content.empty()) return corrupt(field + ".content", "is empty");
      if (*id < 0 || *id >= n_total) {
        return corrupt(field + ".id", fmt::format("{} ({}) is outside the vocabulary [0, {})", *id, quote_text(content),
                                                  n_total));
      }
      AddedToken token;
      token.id = static_cast<int32_t>(*id);
      DI_ASSIGN_OR_RETURN(token.special, optional_bool(a, "special", false, field));
      DI_ASSIGN_OR_RETURN(token.normalized, optional_bool(a, "normalized", !token.special, field));
      DI_ASSIGN_OR_RETURN(token.lstrip, optional_bool(a, "lstrip", false, field));
      DI_ASSIGN_OR_RETURN(token.rstrip, optional_bool(a, "rstrip", false, field));
      DI_ASSIGN_OR_RETURN(const bool single_word, optional_bool(a, "single_word", false, field));
      if (single_word) return unsupported(field + ".single_word", "is not supported");
      if (auto it = t.ids_by_string_.find(content); it != t.ids_by_string_.end() && it->second != token.id) {
        return corrupt(field, fmt::format("{} is id {} in model.vocab, not {}", quote_text(content), it->second, token.id));
      }
      if (token.id < n_model_vocab && t.strings_[token.id] != content) {
        return corrupt(field + ".id", fmt::format("{} is already the model token {}", token.id,
                                                  quote_text(t.strings_[token.id])));
      }
      if (!contents.insert(content).second) return corrupt(field + ".content", fmt::format("{} is repeated", quote_text(content)));
      if (!ids.insert(token.id).second) return corrupt(field + ".id", fmt::format("{} is repeated", token.id));
      token.content = std::move(content);
      tokens.push_back(std::move(token));
    }
    t.strings_.resize(static_cast<size_t>(n_total));
  }

  // Id tables: kinds, strings, and the bytes each id stands for.
  const size_t n = t.strings_.size();
  t.kinds_.assign(n, Tokenizer::Kind::kModel);
  for (const AddedToken& a : tokens) {
    t.kinds_[a.id] = a.special ? Tokenizer::Kind::kSpecial : Tokenizer::Kind::kAdded;
    t.strings_[a.id] = a.content;
  }
  t.bytes_offsets_.assign(n + 1, 0);
  t.bytes_arena_.clear();
  for (size_t id = 0; id < n; ++id) {
    t.bytes_offsets_[id] = t.bytes_arena_.size();
    const std::string& s = t.strings_[id];
    if (t.kinds_[id] != Tokenizer::Kind::kModel) {
      t.bytes_arena_.append(s);
    } else if (auto bytes = byte_level::decode(s)) {
      t.bytes_arena_.append(*bytes);
    } else {
      // A model token outside the byte-level alphabet can never be produced by merges; HF's
      // ByteLevel decoder writes such a token's own UTF-8. Only added tokens may look like this.
      return corrupt("model.vocab", fmt::format("token {} (id {}) is not a byte-level string and is not an added token",
                                                quote_text(s), id));
    }
  }
  t.bytes_offsets_[n] = t.bytes_arena_.size();
  for (const AddedToken& a : tokens) t.ids_by_string_[a.content] = a.id;  // added contents take precedence
  t.added_ = AddedVocabulary(std::move(tokens));
  return Status::ok();
}

Status TokenizerLoader::load_normalizer(const Json* normalizer) {
  if (normalizer == nullptr) return Status::ok();
  if (!normalizer->is_object()) return corrupt("normalizer", "expected an object or null");
  DI_ASSIGN_OR_RETURN(const std::string type, required_string(*normalizer, "type", "normalizer"));
  if (type == "Sequence") {
    const Json* list = member(*normalizer, "normalizers");
    if (list == nullptr || !list->is_array()) return corrupt("normalizer.normalizers", "expected an array");
    if (list->empty()) return Status::ok();
  }
  return unsupported("normalizer", fmt::format("{} is not supported (only none or an empty Sequence)", quote_text(type)));
}

Status TokenizerLoader::load_pre_tokenizer_step(const Json& step, const std::string& field, Tokenizer& t,
                                                bool* has_byte_level) {
  if (!step.is_object()) return corrupt(field, "expected an object");
  DI_ASSIGN_OR_RETURN(const std::string type, required_string(step, "type", field));
  if (type == "Sequence") {
    const Json* list = member(step, "pretokenizers");
    if (list == nullptr || !list->is_array()) return corrupt(field + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      DI_RETURN_IF_ERROR(load_pre_tokenizer_step((*list)[i], fmt::format("{}.pretokenizers[{}]", field, i), t, has_byte_level));
    }
    return Status::ok();
  }
  if (type == "ByteLevel") {
    DI_ASSIGN_OR_RETURN(const bool add_prefix_space, optional_bool(step, "add_prefix_space", false, field));
    if (add_prefix_space) return unsupported(field + ".add_prefix_space", "true is not supported");
    DI_ASSIGN_OR_RETURN(const bool use_regex, optional_bool(step, "use_regex", true, field));
    if (use_regex) {
      auto regex = UnicodeRegex::compile(PreTokenizer::kGpt2Pattern);
      if (!regex) return regex.status().with_context(field);
      t.pre_tokenizer_.add_split(std::move(*regex), SplitBehavior::kIsolated, false);
    }
    *has_byte_level = true;
    return Status::ok();
  }
  if (type == "Split") {
    const Json* pattern = member(step, "pattern");
    if (pattern == nullptr || !pattern->is_object() || pattern->size() != 1)
      return corrupt(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    std::string source;
    if (const Json* r = member(*pattern, "Regex"); r != nullptr && r->is_string()) {
      source = r->get<std::string>();
    } else if (const Json* s = member(*pattern, "String"); s != nullptr && s->is_string()) {
      source = PreTokenizer::escape_literal(s->get<std::string>());
    } else {
      return corrupt(field + ".pattern", "expected {\"Regex\": string} or {\"String\": string}");
    }
    if (source.empty()) return corrupt(field + ".pattern", "is empty");
    DI_ASSIGN_OR_RETURN(const std::string behavior_name, required_string(step, "behavior", field));
    SplitBehavior behavior;
    if (behavior_name == "Removed") behavior = SplitBehavior::kRemoved;
    else if (behavior_name == "Isolated") behavior = SplitBehavior::kIsolated;
    else if (behavior_name == "MergedWithPrevious") behavior = SplitBehavior::kMergedWithPrevious;
    else if (behavior_name == "MergedWithNext") behavior = SplitBehavior::kMergedWithNext;
    else if (behavior_name == "Contiguous") behavior = SplitBehavior::kContiguous;
    else return corrupt(field + ".behavior", fmt::format("unknown behavior {}", quote_text(behavior_name)));
    DI_ASSIGN_OR_RETURN(const bool invert, optional_bool(step, "invert", false, field));
    auto regex = UnicodeRegex::compile(source);
    if (!regex) return regex.status().with_context(field + ".pattern");
    t.pre_tokenizer_.add_split(std::move(*regex), behavior, invert);
    return Status::ok();
  }
  return unsupported(field + ".type", fmt::format("{} is not supported (Sequence, Split, ByteLevel)", quote_text(type)));
}

Status TokenizerLoader::load_pre_tokenizer(const Json* pre, Tokenizer& t) {
  bool has_byte_level = false;
  if (pre != nullptr) DI_RETURN_IF_ERROR(load_pre_tokenizer_step(*pre, "pre_tokenizer", t, &has_byte_level));
  if (!has_byte_level) return unsupported("pre_tokenizer", "has no ByteLevel step (only byte-level BPE is supported)");
  return Status::ok();
}

Status TokenizerLoader::load_decoder(const Json* decoder) {
  if (decoder == nullptr || !decoder->is_object()) return unsupported("decoder", "must be ByteLevel");
  DI_ASSIGN_OR_RETURN(const std::string type, required_string(*decoder, "type", "decoder"));
  if (type != "ByteLevel") return unsupported("decoder.type", fmt::format("{} is not supported (only ByteLevel)", quote_text(type)));
  return Status::ok();
}

Status TokenizerLoader::load_post_processor(const Json* post, const std::string& field, const Tokenizer& t,
                                            std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  if (post == nullptr) return Status::ok();
  if (!post->is_object()) return corrupt(field, "expected an object or null");
  DI_ASSIGN_OR_RETURN(const std::string type, required_string(*post, "type", field));
  if (type == "ByteLevel") return Status::ok();  // offsets only
  if (type == "Sequence") {
    const Json* list = member(*post, "processors");
    if (list == nullptr || !list->is_array()) return corrupt(field + ".processors", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      DI_RETURN_IF_ERROR(load_post_processor(&(*list)[i], fmt::format("{}.processors[{}]", field, i), t, prefix, suffix));
    }
    return Status::ok();
  }
  if (type != "TemplateProcessing")
    return unsupported(field + ".type", fmt::format("{} is not supported", quote_text(type)));
  const Json* single = member(*post, "single");
  const Json* specials = member(*post, "special_tokens");
  if (single == nullptr || !single->is_array()) return corrupt(field + ".single", "expected an array");
  if (specials == nullptr || !specials->is_object()) return corrupt(field + ".special_tokens", "expected an object");
  prefix->clear();
  suffix->clear();
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& piece = (*single)[i];
    const std::string pfield = fmt::format("{}.single[{}]", field, i);
    if (piece.is_object() && member(piece, "Sequence") != nullptr) {
      seen_sequence = true;
      continue;
    }
    const Json* special = piece.is_object() ? member(piece, "SpecialToken") : nullptr;
    if (special == nullptr || !special->is_object()) return corrupt(pfield, "expected Sequence or SpecialToken");
    DI_ASSIGN_OR_RETURN(const std::string name, required_string(*special, "id", pfield + ".SpecialToken"));
    const Json* entry = member(*specials, name.c_str());
    const std::string efield = fmt::format("{}.special_tokens[{}]", field, quote_text(name));
    if (entry == nullptr || !entry->is_object()) return corrupt(efield, "is missing");
    const Json* ids = member(*entry, "ids");
    if (ids == nullptr || !ids->is_array()) return corrupt(efield + ".ids", "expected an array");
    for (const Json& v : *ids) {
      const auto id = as_int(v);
      if (!id || *id < 0 || *id >= t.vocab_size())
        return corrupt(efield + ".ids", fmt::format("{} is not an id below the vocabulary size {}", v.dump(), t.vocab_size()));
      (seen_sequence ? suffix : prefix)->push_back(static_cast<int32_t>(*id));
    }
  }
  return Status::ok();
}

Status TokenizerLoader::load_config(const Json& config, Tokenizer& t, bool* has_add_flags) {
  const std::string file = "tokenizer_config.json";
  if (!config.is_object()) return corrupt(file, "expected an object");
  for (auto [key, slot] : {std::pair{"bos_token", &t.bos_id_}, std::pair{"eos_token", &t.eos_id_}}) {
    const Json* v = member(config, key);
    if (v == nullptr) continue;
    std::string content;
    if (v->is_string()) {
      content = v->get<std::string>();
    } else if (v->is_object()) {
      DI_ASSIGN_OR_RETURN(content, required_string(*v, "content", file + "." + key));
    } else {
      return corrupt(file + "." + key, "expected a string, an object with \"content\", or null");
    }
    const auto id = t.token_to_id(content);
    if (!id) return corrupt(file + "." + key, fmt::format("{} is not in the vocabulary", quote_text(content)));
    *slot = *id;
  }
  DI_ASSIGN_OR_RETURN(const bool add_bos, optional_bool(config, "add_bos_token", false, file));
  DI_ASSIGN_OR_RETURN(const bool add_eos, optional_bool(config, "add_eos_token", false, file));
  *has_add_flags = member(config, "add_bos_token") != nullptr || member(config, "add_eos_token") != nullptr;
  if (*has_add_flags) {
    t.prefix_ids_.clear();
    t.suffix_ids_.clear();
    if (add_bos) {
      if (!t.bos_id_) return corrupt(file + ".add_bos_token", "is true but there is no bos_token");
      t.prefix_ids_.push_back(*t.bos_id_);
    }
    if (add_eos) {
      if (!t.eos_id_) return corrupt(file + ".add_eos_token", "is true but there is no eos_token");
      t.suffix_ids_.push_back(*t.eos_id_);
    }
  }
  if (const Json* tmpl = member(config, "chat_template")) {
    if (tmpl->is_string()) {
      t.chat_template_ = tmpl->get<std::string>();
    } else if (tmpl->is_array()) {
      // [{"name": ..., "template": ...}]: keep the "default" one.
      for (const Json& entry : *tmpl) {
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
            entry["template"].is_string()) {
          t.chat_template_ = entry["template"].get<std::string>();
        }
      }
    } else {
      return corrupt(file + ".chat_template", "expected a string or a list of named templates");
    }
  }
  return Status::ok();
}

Expected<std::unique_ptr<Tokenizer>> TokenizerLoader::build(const Json& root, const Json* config) {
  if (!root.is_object()) return corrupt("tokenizer.json", "expected an object");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const Json* model = member(root, "model");
  if (model == nullptr) return corrupt("model", "is missing");
  int32_t n_model_vocab = 0;
  DI_RETURN_IF_ERROR(load_model(*model, *t, &n_model_vocab));
  DI_RETURN_IF_ERROR(load_added_tokens(member(root, "added_tokens"), n_model_vocab, *t));
  DI_RETURN_IF_ERROR(load_normalizer(member(root, "normalizer")));
  DI_RETURN_IF_ERROR(load_pre_tokenizer(member(root, "pre_tokenizer"), *t));
  DI_RETURN_IF_ERROR(load_decoder(member(root, "decoder")));
  DI_RETURN_IF_ERROR(load_post_processor(member(root, "post_processor"), "post_processor", *t, &t->prefix_ids_,
                                         &t->suffix_ids_));
  if (config != nullptr) {
    bool has_add_flags = false;
    DI_RETURN_IF_ERROR(load_config(*config, *t, &has_add_flags));
  }
  return t;
}

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_json(const nlohmann::json& tokenizer, const nlohmann::json* config) {
  return TokenizerLoader::build(tokenizer, config);
}

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_json_text(std::string_view tokenizer_json,
                                                               std::string_view config_json) {
  auto root = parse_json_strict(tokenizer_json);
  if (!root) return root.status().with_context("tokenizer.json");
  if (config_json.empty()) return from_json(*root, nullptr);
  auto config = parse_json_strict(config_json);
  if (!config) return config.status().with_context("tokenizer_config.json");
  return from_json(*root, &*config);
}

Expected<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "tokenizer.json").string();
  auto root = read_json_file(path);
  if (!root) return root.status();
  const std::string config_path = (fs::path(dir) / "tokenizer_config.json").string();
  std::error_code ec;
  std::optional<Json> config;
  if (fs::exists(config_path, ec)) {
    auto c = read_json_file(config_path);
    if (!c) return c.status();
    config = std::move(*c);
  }
  auto t = from_json(*root, config ? &*config : nullptr);
  if (!t) return t.status().with_context(fmt::format("tokenizer in {}", quote_text(dir)));
  return t;
}

}  // namespace deepinfer
