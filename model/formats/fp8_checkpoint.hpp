#pragma once
// FP8 E4M3 checkpoint weights as published (model_config.hpp, WeightQuantization): each F8_E4M3
// weight "X.weight" with its scale tensor, "X.weight_scale" (one per tensor or per output channel,
// or per block for compressed-tensors' block strategy) or "X.weight_scale_inv" (per block,
// quant_method "fp8" with weight_block_size; the multiplier despite its name: w = q * s).
// "X.input_scale" (static activation scales) is accepted and unused. The scales are expanded to
// one array per row, exactly: kernels/forward_ops.hpp's representation.
#include <string_view>

#include "model/formats/model_config.hpp"
#include "model/formats/tensor_source.hpp"

namespace fp8serve {

class SafetensorsModel;
struct SafetensorsTensor;

// True for the names of FP8 scale tensors (…weight_scale, …weight_scale_inv, …input_scale).
bool is_fp8_scale_name(std::string_view name);

// The codes and expanded scales of an F8_E4M3 weight. FormatError naming the tensor when the
// config declares no FP8 quantization, the scale is missing, misshapen, not finite and positive,
// or the codes hold NaN.
Fp8Weight fp8_checkpoint_weight(const SafetensorsModel& model, const SafetensorsTensor& weight,
                                const WeightQuantization& quantization);

// FormatError naming any scale tensor whose weight is absent or not F8_E4M3.
void check_fp8_scales_have_weights(const SafetensorsModel& model);

}  // namespace fp8serve
