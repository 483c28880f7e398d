# examples.translate: bahdanau_fra_eng trains the Transformer briefly and
# saves it; translate then decodes the example's four sentences from a file
# greedily, which must give the translations the example printed with
# predict_seq2seq, and with a beam of 3 prints 2 hypotheses each, scored
# best first; a missing checkpoint and a checkpoint of other sizes are one
# line on stderr and exit 1.
#   cmake -DTRAIN=... -DTRANSLATE=... -DWORK=... -P translate_check.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
execute_process(COMMAND "${TRAIN}" --model transformer --epochs 10 --threads 2
                        --out "${WORK}/out" --save "${WORK}/model.pt"
                OUTPUT_VARIABLE trained ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS "${WORK}/model.pt")
  message(FATAL_ERROR "bahdanau_fra_eng --save: exit ${rc}\n${trained}${err}")
endif()
set(sentences "go ." "i lost ." "he's calm ." "i'm home .")
file(WRITE "${WORK}/input.txt" "go .\ni lost .\nhe's calm .\ni'm home .\n")

execute_process(COMMAND "${TRANSLATE}" --model transformer --checkpoint "${WORK}/model.pt"
                        --input "${WORK}/input.txt" --batch-size 3
                OUTPUT_VARIABLE greedy ERROR_VARIABLE progress RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "translate: exit ${rc}\n${greedy}${progress}")
endif()
if(NOT progress MATCHES "translated 4 of 4 sentences")
  message(FATAL_ERROR "no progress line on stderr: '${progress}'")
endif()
string(REPLACE "\n" ";" greedy_lines "${greedy}")
list(FILTER greedy_lines EXCLUDE REGEX "^$")
list(LENGTH greedy_lines n)
if(NOT n EQUAL 4)
  message(FATAL_ERROR "greedy: expected 4 lines, got ${n}:\n${greedy}")
endif()
set(i 0)
foreach(sentence IN LISTS sentences)
  list(GET greedy_lines ${i} line)
  string(REGEX MATCH "^${i}\t-?[0-9]+[.][0-9]+\t(.*)$" matched "${line}")
  if(matched STREQUAL "")
    message(FATAL_ERROR "greedy line ${i} is not 'index<TAB>score<TAB>translation': '${line}'")
  endif()
  set(ours "${CMAKE_MATCH_1}")
  string(FIND "${trained}" "${sentence} => ${ours}, bleu" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "greedy translation of '${sentence}' is '${ours}', not what "
                        "bahdanau_fra_eng's predict_seq2seq printed:\n${trained}")
  endif()
  math(EXPR i "${i} + 1")
endforeach()

execute_process(COMMAND "${TRANSLATE}" --model transformer --checkpoint "${WORK}/model.pt"
                        --input "${WORK}/input.txt" --beam 3 --nbest 2 --length-penalty 0.75
                OUTPUT_VARIABLE beam ERROR_VARIABLE err RESULT_VARIABLE rc)
string(REPLACE "\n" ";" beam_lines "${beam}")
list(FILTER beam_lines EXCLUDE REGEX "^$")
list(LENGTH beam_lines n)
if(NOT rc EQUAL 0 OR NOT n EQUAL 8)
  message(FATAL_ERROR "beam 3, nbest 2: exit ${rc}, ${n} lines:\n${beam}${err}")
endif()
foreach(s RANGE 3)
  math(EXPR first "2 * ${s}")
  math(EXPR second "2 * ${s} + 1")
  list(GET beam_lines ${first} a)
  list(GET beam_lines ${second} b)
  string(REGEX MATCH "^${s}\t(-?[0-9.]+)\t" _ "${a}")
  set(score_a "${CMAKE_MATCH_1}")
  string(REGEX MATCH "^${s}\t(-?[0-9.]+)\t" _ "${b}")
  set(score_b "${CMAKE_MATCH_1}")
  if(score_a STREQUAL "" OR score_b STREQUAL "" OR score_a LESS score_b)
    message(FATAL_ERROR "sentence ${s}: hypotheses not 'index<TAB>score<TAB>...' best first:\n${a}\n${b}")
  endif()
endforeach()

execute_process(COMMAND "${TRANSLATE}" --checkpoint "${WORK}/missing.pt"
                        --input "${WORK}/input.txt"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "^translate: cannot read --checkpoint .*missing.pt\n$")
  message(FATAL_ERROR "a missing checkpoint: exit ${rc}, stderr '${err}'")
endif()
execute_process(COMMAND "${TRANSLATE}" --model transformer --num-hiddens 16
                        --checkpoint "${WORK}/model.pt" --input "${WORK}/input.txt"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "^translate: --checkpoint .* is not a transformer model of --num-hiddens 16[^\n]*\n$")
  message(FATAL_ERROR "a checkpoint of other sizes: exit ${rc}, stderr '${err}'")
endif()
message("translate: greedy equals predict_seq2seq on 4 sentences; beam 3 n-best 2; errors refused")
