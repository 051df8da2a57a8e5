// server/output_grammar.h: what a request's output must look like, as one grammar over K3's whole
// output (structured/), so the output parser can never see a malformed answer or tool call.
//
// A chat output, after the generation prompt opened its first channel:
//   [ think text <|close|>think<|sep|> ]            only when the prompt opened <think>: free text
//   <|open|>response<|sep|> ANSWER <|close|>response<|sep|>
//   [ <|open|>tools<|sep|> CALL+ <|close|>tools<|sep|> ]
//   <|close|>message<|sep|>                          then the model's eos (the grammar's end token)
// ANSWER is free text, or the JSON / regex / choice / grammar the request asks for (response_format,
// text.format, output_config.format, structured_outputs, guided_*). CALL is
//   <|open|>call tool="NAME" index="i"<|sep|><|open|>json type="object"<|sep|> ARGS <|close|>json<|sep|><|close|>call<|sep|>
// with i a number (the parser reads any) and ARGS K3's argument elements or a JSON block with any
// object, or, for a strict tool, only the JSON block with an object of its parameters schema.
// The tools part is required for tool_choice required / a named tool (Messages: any / tool), and
// then the response text before it is empty (as vLLM's required mode and Anthropic's any / tool),
// optional under auto when a tool is strict, absent under none; parallel_tool_calls false
// (disable_parallel_tool_use) allows exactly one call. A request with none of these is not
// constrained at all.
#pragma once
#include <memory>
#include <string>

#include "server/request_params.h"
#include "structured/grammar_cache.h"

namespace k3::server {

// The GBNF for a chat request's output, or "" when nothing constrains it. Throws a 400 naming the
// field whose schema cannot be compiled (an unsupported keyword, a bad pattern, ...).
std::string chat_output_grammar(const ChatPrompt& chat, tokenizer::Channel start);
// The GBNF for a completion's text (structured_outputs / guided_* only), or "".
std::string completion_output_grammar(const StructuredOutputs& so);

// Compiles `text` with the server's cache; a 400 naming `field` when the grammar is refused.
std::shared_ptr<const structured::CompiledGrammar> compile_output_grammar(const std::string& text,
                                                                          const ParseContext& ctx,
                                                                          const std::string& field);

// The model's tokens as grammar symbols: every tokenizer token (special ones as single symbols),
// the ids past the tokenizer (a padded model vocabulary) never allowed, `eos` the end token.
std::shared_ptr<const structured::Vocabulary> grammar_vocabulary(const tokenizer::Tokenizer& tokenizer,
                                                                 int32_t model_vocab, int32_t eos);

}  // namespace k3::server
