// Chat templates: the Jinja source in tokenizer.chat_template is not executed; its family is
// recognised by the markers it writes and the prompt is rendered by hand for that family.
#include <fmt/format.h>

#include <array>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>

#include "escala/tokenizer.h"

namespace escala::model {

namespace {

struct NamedFormat {
  std::string_view name;
  ChatFormat format;
};
constexpr std::array kFormats{
    NamedFormat{"chatml", ChatFormat::kChatMl},
    NamedFormat{"llama3", ChatFormat::kLlama3},
    NamedFormat{"gemma", ChatFormat::kGemma},
    NamedFormat{"llama2", ChatFormat::kLlama2},
};

std::string known_names() {
  std::string s;
  for (const NamedFormat& f : kFormats) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

std::string_view trim(std::string_view s) {
  const char* kSpace = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) + 1 - b);
}

// The system prompt a ChatML template writes when the conversation has none: the first plain
// string literal '<|im_start|>system\n...<|im_end|>' (one built from a message's content is code,
// not a literal, and is passed over).
std::string find_default_system(std::string_view jinja) {
  constexpr std::string_view kOpen = "<|im_start|>system";
  constexpr std::string_view kClose = "<|im_end|>";
  for (size_t pos = jinja.find(kOpen); pos != std::string_view::npos; pos = jinja.find(kOpen, pos + 1)) {
    std::string_view rest = jinja.substr(pos + kOpen.size());
    if (rest.substr(0, 1) == "\n") rest.remove_prefix(1);
    else if (rest.substr(0, 2) == "\\n") rest.remove_prefix(2);
    else continue;
    const size_t end = rest.find(kClose);
    if (end == std::string_view::npos) continue;
    const std::string_view body = rest.substr(0, end);
    // Anything that looks like template code means the text is not a literal.
    if (body.empty() || body.find_first_of("{}+'\"") != std::string_view::npos) continue;
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '\\' && i + 1 < body.size()) {
        const char c = body[++i];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        out += body[i];
      }
    }
    return out;
  }
  return {};
}

Status check_roles(std::span<const ChatMessage> messages, std::string_view format) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      return Status::error(fmt::format("chat template {}: unknown role '{}' (system, user, assistant)", format, r));
    if (r == "system" && i != 0)
      return Status::error(fmt::format("chat template {}: a system message must come first", format));
  }
  return {};
}

}  // namespace

Result<ChatTemplate> ChatTemplate::from_name(std::string_view name) {
  for (const NamedFormat& f : kFormats) {
    if (f.name == name) {
      ChatTemplate t;
      t.format_ = f.format;
      return t;
    }
  }
  return Status::error(fmt::format("--chat-template: unknown template '{}' (known: {})", name, known_names()));
}

Result<ChatTemplate> ChatTemplate::from_jinja(std::string_view jinja) {
  ChatTemplate t;
  if (jinja.empty() || jinja.find("<|im_start|>") != std::string_view::npos) {
    t.format_ = ChatFormat::kChatMl;
    t.default_system_ = find_default_system(jinja);
  } else if (jinja.find("<|start_header_id|>") != std::string_view::npos) {
    t.format_ = ChatFormat::kLlama3;
  } else if (jinja.find("<start_of_turn>") != std::string_view::npos) {
    t.format_ = ChatFormat::kGemma;
  } else if (jinja.find("[INST]") != std::string_view::npos) {
    t.format_ = ChatFormat::kLlama2;
  } else {
    std::string head(jinja.substr(0, 60));
    for (char& c : head)
      if (c == '\n' || c == '\r') c = ' ';
    return Status::error(fmt::format(
        "chat template: tokenizer.chat_template is not a known family ('{}...'); pass --chat-template NAME "
        "with NAME one of {}",
        head, known_names()));
  }
  return t;
}

Result<ChatTemplate> ChatTemplate::for_model(const Tokenizer& tokenizer, std::string_view override_name) {
  if (!override_name.empty()) {
    auto t = from_name(override_name);
    // A named ChatML still takes the model's own default system prompt when it has one.
    if (t.ok() && t->format_ == ChatFormat::kChatMl) t->default_system_ = find_default_system(tokenizer.chat_template());
    return t;
  }
  return from_jinja(tokenizer.chat_template());
}

std::string_view ChatTemplate::name() const {
  for (const NamedFormat& f : kFormats)
    if (f.format == format_) return f.name;
  return "?";
}

Result<std::string> ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
  // Appends piece by piece (chains of operator+ trip a false -Wrestrict in GCC 12).
  std::string out;
  auto put = [&out](std::initializer_list<std::string_view> parts) {
    for (std::string_view p : parts) out.append(p);
  };
  switch (format_) {
    case ChatFormat::kChatMl: {
      if (!default_system_.empty() && (messages.empty() || messages[0].role != "system"))
        put({"<|im_start|>system\n", default_system_, "<|im_end|>\n"});
      for (const ChatMessage& m : messages) put({"<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n"});
      if (add_generation_prompt) put({"<|im_start|>assistant\n"});
      break;
    }
    case ChatFormat::kLlama3: {
      for (const ChatMessage& m : messages)
        put({"<|start_header_id|>", m.role, "<|end_header_id|>\n\n", trim(m.content), "<|eot_id|>"});
      if (add_generation_prompt) put({"<|start_header_id|>assistant<|end_header_id|>\n\n"});
      break;
    }
    case ChatFormat::kGemma: {
      ESCALA_RETURN_IF_ERROR(check_roles(messages, "gemma"));
      std::string_view system;  // Gemma has no system turn: it opens the first user turn
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          system = trim(m.content);
          continue;
        }
        const bool user = m.role == "user";
        put({"<start_of_turn>", user ? "user" : "model", "\n"});
        if (user && !system.empty()) {
          put({system, "\n\n"});
          system = {};
        }
        put({trim(m.content), "<end_of_turn>\n"});
      }
      if (add_generation_prompt) put({"<start_of_turn>model\n"});
      break;
    }
    case ChatFormat::kLlama2: {
      ESCALA_RETURN_IF_ERROR(check_roles(messages, "llama2"));
      std::string_view system;
      bool first_turn = true;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          system = trim(m.content);
        } else if (m.role == "user") {
          // BOS opens every turn; the first one comes from the tokenizer, the rest are text.
          put({first_turn ? "" : "<s>", "[INST] "});
          if (!system.empty()) put({"<<SYS>>\n", system, "\n<</SYS>>\n\n"});
          system = {};
          put({trim(m.content), " [/INST]"});
          first_turn = false;
        } else {
          put({" ", trim(m.content), " </s>"});
        }
      }
      // Llama 2 has no generation prompt: the model answers after " [/INST]".
      break;
    }
  }
  return out;
}

}  // namespace escala::model
