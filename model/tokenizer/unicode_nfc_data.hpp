#pragma once
// Unicode tables for NFC, generated from Python's unicodedata by gen_unicode_nfc_data.py.
#include <cstddef>
#include <cstdint>

namespace fp8serve::nfc_data {

struct CombiningClass { char32_t cp; uint8_t ccc; };           // sorted by cp, ccc != 0 only
struct Decomposition { char32_t cp; char32_t first, second; };  // sorted by cp; second 0 = single
struct Composition { char32_t first, second, composite; };      // sorted by (first, second)

extern const CombiningClass combining_classes[];
extern const std::size_t combining_classes_size;
extern const Decomposition decompositions[];
extern const std::size_t decompositions_size;
extern const Composition compositions[];
extern const std::size_t compositions_size;

}  // namespace fp8serve::nfc_data
