// /metrics in the Prometheus text exposition format.
#include <fmt/format.h>

#include "server/http_server.h"

namespace escala::server {

std::string metrics_text(const engine::EngineStats& s, const std::string& model_id) {
  std::string out;
  const std::string label = fmt::format("{{model=\"{}\"}}", model_id);
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{} {}\n", name, help, name, type, name, label, value);
  };
  metric("escala_requests_running", "gauge", "Requests being computed (in the batch).", double(s.running));
  metric("escala_requests_waiting", "gauge", "Requests queued for admission (preempted ones included).",
         double(s.waiting));
  metric("escala_requests_finished_total", "counter", "Requests that ended with stop or length.",
         double(s.requests_finished));
  metric("escala_requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown).",
         double(s.requests_cancelled));
  metric("escala_requests_failed_total", "counter", "Requests that ended with an error.", double(s.requests_failed));
  metric("escala_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", double(s.prompt_tokens));
  metric("escala_generation_tokens_total", "counter", "Generated tokens.", double(s.generated_tokens));
  metric("escala_generation_tokens_per_second", "gauge", "Generated tokens per second over the last 5 s.",
         s.tokens_per_second);
  metric("escala_preemptions_total", "counter", "Sequences preempted (freed, to be recomputed) for KV blocks.",
         double(s.preemptions));
  metric("escala_engine_steps_total", "counter", "Engine steps (forward passes).", double(s.steps));
  metric("escala_kv_blocks_total", "gauge", "KV cache blocks in the pool.", double(s.cache.total_blocks));
  metric("escala_kv_blocks_used", "gauge", "KV blocks referenced by a sequence.", double(s.cache.used_blocks));
  metric("escala_kv_blocks_free", "gauge", "KV blocks not referenced (cached ones included).",
         double(s.cache.free_blocks));
  metric("escala_kv_blocks_cached", "gauge", "Free KV blocks kept for prefix hits.", double(s.cache.cached_blocks));
  metric("escala_kv_cache_bytes_in_use", "gauge", "Bytes of the used KV blocks.", double(s.cache.bytes_in_use));
  metric("escala_prefix_cache_hit_rate", "gauge", "Prompt tokens served from the prefix cache / looked up.",
         s.cache.hit_rate);
  metric("escala_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
         double(s.cache.prefix_hit_tokens));
  metric("escala_prefix_cache_query_tokens_total", "counter", "Prompt tokens looked up in the prefix cache.",
         double(s.cache.prefix_query_tokens));
  const char* h = "escala_time_to_first_token_seconds";
  out += fmt::format("# HELP {} Time from arrival to the first generated token.\n# TYPE {} histogram\n", h, h);
  for (size_t b = 0; b < s.ttft_buckets.size(); ++b)
    out += fmt::format("{}_bucket{{model=\"{}\",le=\"{}\"}} {}\n", h, model_id, s.ttft_buckets[b], s.ttft_counts[b]);
  out += fmt::format("{}_bucket{{model=\"{}\",le=\"+Inf\"}} {}\n", h, model_id, s.ttft_count);
  out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", h, label, s.ttft_sum, h, label, s.ttft_count);
  return out;
}

}  // namespace escala::server
