/* tools/demo_text.c — the demo's text, built into the binary (data/shakespeare.txt) so
   `loom train` with no arguments works from any folder. */
__asm__(".section .rodata\n"
        ".global demo_text\n"
        ".type demo_text, @object\n"
        "demo_text:\n"
        ".incbin \"" LOOM_DEMO_TEXT "\"\n"
        ".global demo_text_end\n"
        "demo_text_end:\n"
        ".byte 0\n"
        ".previous\n");
